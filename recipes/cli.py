"""The recipes' ``LightningCLI``: any model of :mod:`recipes.models` with any data module.

``num_classes`` and ``class_counts`` are linked from the instantiated data module into the model
(``apply_on="instantiate"``). The model's ``head`` and ``sampler`` are factories (see
:mod:`recipes.specs`): a config names their classes and their own arguments, which the parser
checks, documents (``--model.head.help``) and prints (``--print_config``); the model calls them
with what it injects. Run from a checkout: ``python -m recipes`` (the distribution does not install
``recipes``).

The subcommands are ``fit``, ``validate`` and ``test`` (the recipes have no ``predict_step``).
Options are spelled in full (``--trainer.max_epoch`` is an error, not ``max_epochs``), and a parse
error prints the error and where ``--help`` is, not the whole usage before it.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from .data import RecipeData
from .module import SampledModule


class RecipeParser(LightningArgumentParser):
    """``LightningArgumentParser`` that takes no abbreviated option (argparse's ``allow_abbrev``
    would read ``--trainer.max_epoch 2`` as ``--trainer.max_epochs 2``), names itself
    ``python -m recipes`` (the command its error messages tell to run with ``--help``), and
    whose usage, which jsonargparse prints before every parse error, is one line: the full list
    of options (50 lines above the error that matters) is what ``--help`` prints."""

    def __init__(
        self,
        *args: Any,
        prog: str = "python -m recipes",
        allow_abbrev: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, prog=prog, allow_abbrev=allow_abbrev, **kwargs)

    def format_usage(self) -> str:
        return f"usage: {self.prog} [options]\n"


class RecipeCLI(LightningCLI):
    """``LightningCLI`` over :class:`SampledModule` and :class:`RecipeData` subclasses, parsed by
    :class:`RecipeParser`, without ``predict``."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Lightning's subcommands but ``predict``, which needs a ``predict_step`` (or a
        ``forward``) that the recipes' modules do not define."""
        return {k: v for k, v in LightningCLI.subcommands().items() if k != "predict"}

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for name in ("num_classes", "class_counts"):
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")


#: the first line of ``python -m recipes --help`` after the usage (Lightning's own is "Lightning
#: Trainer command line tool"); the subcommands keep the first line of the ``Trainer`` method's
#: docstring ("Runs the full optimization routine.").
DESCRIPTION = "Fit, validate or test a recipe model with any head, from YAML configs."

USER_ERRORS = (ValueError, FileNotFoundError)


def root_cause(err: BaseException) -> BaseException:
    """The innermost exception of ``err``'s ``__cause__`` / ``__context__`` chain that is a
    configuration or data error of ours (``err`` itself if there is none)."""
    found, seen = err, set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, USER_ERRORS):
            found = err
        err = err.__cause__ or err.__context__
    return found


def cli_main(args: list[str] | None = None) -> None:
    """The command line: like :func:`main`, but a bad config or missing data file exits with a
    one-line ``error:`` message instead of a traceback from inside jsonargparse."""
    try:
        main(args)
    except USER_ERRORS as err:
        cause = root_cause(err)
        raise SystemExit(f"error: {type(cause).__name__}: {cause}") from None


def main(
    args: list[str] | None = None,
    run: bool = True,
    parser_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> RecipeCLI:
    """Runs the CLI (``args`` default to ``sys.argv``); ``run=False`` only instantiates.
    ``parser_kwargs`` go to the parsers as ``LightningCLI``'s do; the main parser's
    ``description`` defaults to :data:`DESCRIPTION`."""
    return RecipeCLI(
        SampledModule,
        RecipeData,
        subclass_mode_model=True,
        subclass_mode_data=True,
        parser_class=RecipeParser,
        parser_kwargs={"description": DESCRIPTION, **(parser_kwargs or {})},
        args=args,
        run=run,
        **kwargs,
    )
