"""``TemperatureSchedule``: anneal a float that a module declares schedulable (a head's logit
``temperature``, TAPAS' ``selection_temperature``), named explicitly."""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from .._validation import check_finite_number
from ..protocols import Schedulable

SCHEDULES = ("constant", "linear", "exponential", "cosine")
INTERVALS = ("step", "epoch")


def schedule_value(schedule: str, start: float, end: float, progress: float) -> float:
    """The value of ``schedule`` at ``progress`` in ``[0, 1]`` (clamped), from ``start`` to ``end``.

    ``constant``: ``start``; ``linear``: ``start + (end - start) p``; ``exponential``:
    ``start (end / start)^p`` (geometric, both positive); ``cosine``:
    ``end + (start - end) (1 + cos(pi p)) / 2``.
    """
    p = min(max(progress, 0.0), 1.0)
    if schedule == "constant":
        return start
    if schedule == "linear":
        return start + (end - start) * p
    if schedule == "exponential":
        return start * (end / start) ** p
    if schedule == "cosine":
        return end + (start - end) * (1.0 + math.cos(math.pi * p)) / 2.0
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")


class TemperatureSchedule(pl.Callback):
    """Sets ``attribute`` of the matching submodules to a scheduled value and logs it.

    The submodules are those that declare ``attribute`` in their ``schedulable`` names
    (:class:`~lightning_sampled.protocols.Schedulable`): every head declares ``"temperature"``
    (its logits' temperature), :class:`~lightning_sampled.heads.TapasHead` also
    ``"selection_temperature"`` (the second pass' ``tau``, which the paper lowers).

    The clock is the trainer's: ``trainer.global_step`` (optimizer steps) for ``interval="step"``,
    applied before every training batch, or ``trainer.current_epoch`` for ``interval="epoch"``,
    applied at the start of every training epoch. At clock ``t`` the value is
    :func:`schedule_value` at progress ``t / total``, so it reaches ``end`` at ``t = total`` and
    stays there. The value is logged under ``<module_path>.<attribute>`` (or ``<attribute>``).

    Resume: the value is a function of the trainer's clock, which Lightning restores, and it is
    set before every batch (or epoch), so a resumed run sees the same value at every step as an
    uninterrupted one even though the attribute, a plain float, is not in the model's
    ``state_dict`` (``on_train_start`` sets it too: a run resumed mid-epoch gets no
    ``on_train_epoch_start`` for that epoch). The callback's state (the last value set and its
    clock) goes into checkpoints; on resume it is compared with this schedule, with a warning if
    the schedule was changed.

    Args:
        attribute: the attribute to set, e.g. ``"selection_temperature"`` of
            :class:`~lightning_sampled.heads.TapasHead`; required, since every head has a
            ``"temperature"`` and annealing the wrong one changes the model silently.
        start: the value at clock 0.
        end: the value at clock ``total`` (required unless ``schedule="constant"``).
        schedule: ``"constant"``, ``"linear"``, ``"exponential"`` (both ends positive) or
            ``"cosine"``.
        interval: ``"step"`` or ``"epoch"``.
        total: steps or epochs from ``start`` to ``end`` (required unless constant).
        module_path: dotted path of the one submodule to set (``pl_module.get_submodule``); when
            ``None``, every submodule that declares ``attribute`` (at least one must).
    """

    def __init__(
        self,
        attribute: str,
        *,
        start: float,
        end: float | None = None,
        schedule: str = "constant",
        interval: str = "step",
        total: int | None = None,
        module_path: str | None = None,
    ) -> None:
        if not isinstance(attribute, str) or not attribute.isidentifier():
            raise ValueError(f"attribute must be an attribute name, got {attribute!r}")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        if interval not in INTERVALS:
            raise ValueError(f"interval must be one of {INTERVALS}, got {interval!r}")
        if module_path is not None and (not isinstance(module_path, str) or not module_path):
            raise ValueError(
                f"module_path must be a non-empty dotted path or None, got {module_path!r}"
            )
        self.start = check_finite_number("start", start)
        if schedule == "constant":
            if end is not None and check_finite_number("end", end) != self.start:
                raise ValueError(
                    f"a constant schedule needs end=None or end=start, got end={end!r}"
                )
            self.end = self.start
        elif end is None:
            raise ValueError(f"end is required for schedule={schedule!r}")
        else:
            self.end = check_finite_number("end", end)
        if schedule == "exponential" and (self.start <= 0 or self.end <= 0):
            raise ValueError(
                f"an exponential schedule needs start > 0 and end > 0, got start={start!r}, "
                f"end={end!r}"
            )
        needs_total = schedule != "constant"
        if (total is not None or needs_total) and (
            isinstance(total, bool) or not isinstance(total, int) or total < 1
        ):
            raise ValueError(f"total must be a positive integer, got {total!r}")
        self.attribute = attribute
        self.schedule = schedule
        self.interval = interval
        self.total = total
        self.module_path = module_path
        self.log_name = attribute if module_path is None else f"{module_path}.{attribute}"
        self.value: float | None = None
        self.clock: int | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(attribute=self.attribute, module_path=self.module_path)

    def value_at(self, clock: int) -> float:
        """The scheduled value at step or epoch ``clock``."""
        progress = 0.0 if self.total is None else clock / self.total
        return schedule_value(self.schedule, self.start, self.end, progress)

    def targets(self, pl_module: pl.LightningModule) -> list[nn.Module]:
        """The modules whose ``attribute`` is set: those that declare it schedulable."""
        if self.module_path is not None:
            module = pl_module.get_submodule(self.module_path)
            if not self._declares(module):
                declared = module.schedulable if isinstance(module, Schedulable) else ()
                raise ValueError(
                    f"module {self.module_path!r} ({type(module).__name__}) does not declare "
                    f"{self.attribute!r} schedulable (it declares {declared})"
                )
            return [module]
        found = [m for m in pl_module.modules() if self._declares(m)]
        if not found:
            raise ValueError(
                f"no submodule of {type(pl_module).__name__} declares {self.attribute!r} "
                f"schedulable (a module's `schedulable` names); pass module_path or check the "
                f"attribute name"
            )
        return found

    def _declares(self, module: nn.Module) -> bool:
        return isinstance(module, Schedulable) and self.attribute in module.schedulable

    def _apply(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> float:
        clock = trainer.global_step if self.interval == "step" else trainer.current_epoch
        value = self.value_at(clock)
        for module in self.targets(pl_module):
            setattr(module, self.attribute, value)
        self.value, self.clock = value, clock
        return value

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Checks that every target takes the schedule's values before the first step, not
        when the schedule reaches a bad one ``total`` steps later: the values lie between
        ``start`` and ``end`` (every schedule is monotone), so both ends are set and the
        attribute restored.

        Raises:
            ValueError: naming the schedule, the end and the module that refuses it.
        """
        for module in self.targets(pl_module):
            current = getattr(module, self.attribute)
            try:
                for name, value in (("start", self.start), ("end", self.end)):
                    try:
                        setattr(module, self.attribute, value)
                    except ValueError as error:
                        raise ValueError(
                            f"TemperatureSchedule({self.log_name}): {name}={value!r} is refused "
                            f"by {type(module).__name__}: {error}"
                        ) from error
            finally:
                setattr(module, self.attribute, current)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A run resumed mid-epoch gets no on_train_epoch_start for that epoch.
        self._apply(trainer, pl_module)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.interval == "step":
            value = self._apply(trainer, pl_module)
            pl_module.log(self.log_name, value, on_step=True, on_epoch=False, batch_size=1)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.interval == "epoch":
            value = self._apply(trainer, pl_module)
            pl_module.log(self.log_name, value, on_step=False, on_epoch=True, batch_size=1)

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "clock": self.clock}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.value = state_dict["value"]
        self.clock = state_dict["clock"]
        if self.clock is not None and not math.isclose(self.value_at(self.clock), self.value):
            rank_zero_warn(
                f"TemperatureSchedule({self.log_name}): the checkpoint set {self.value:.6g} at "
                f"{self.interval} {self.clock}, this schedule gives {self.value_at(self.clock):.6g}"
                f" there; the resumed run follows this schedule"
            )
