"""TemperatureSchedule: values at stated steps and epochs, logging, and checkpoint resume."""

import math

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_sampled.callbacks import TemperatureSchedule
from lightning_sampled.callbacks.temperature import schedule_value
from lightning_sampled.heads import SampledSoftmaxHead, TapasHead

TAU = "selection_temperature"


class TinyModel(pl.LightningModule):
    def __init__(self, temperature=5.0):
        super().__init__()
        self.encoder = torch.nn.Linear(4, 8)
        self.head = TapasHead(
            30, 8, num_negatives=4, presample_factor=2, selection_temperature=temperature
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.head(self.encoder(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Recorder(pl.Callback):
    """Records (global_step, epoch, TAPAS' selection temperature) as each training batch starts."""

    def __init__(self):
        self.seen = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen[trainer.global_step] = (
            trainer.current_epoch,
            pl_module.head.selection_temperature,
        )


def loader():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 4), torch.randint(0, 30, (16,)))
    return DataLoader(data, batch_size=4)  # 4 steps per epoch


def fit(schedule, tmp_path, *, max_steps=-1, max_epochs=None, ckpt_path=None, ckpt_every=None):
    pl.seed_everything(0)
    model, recorder = TinyModel(), Recorder()
    callbacks = [schedule, recorder]
    if ckpt_every is not None:
        callbacks.append(
            pl.callbacks.ModelCheckpoint(
                dirpath=tmp_path, every_n_train_steps=ckpt_every, save_top_k=-1, filename="{step}"
            )
        )
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        max_epochs=max_epochs,
        logger=False,
        enable_checkpointing=ckpt_every is not None,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(model, loader(), ckpt_path=ckpt_path)
    return trainer, model, recorder.seen


@pytest.mark.parametrize(
    "schedule,progress,want",
    [
        ("constant", 0.7, 2.0),
        ("linear", 0.0, 2.0),
        ("linear", 0.25, 1.55),
        ("linear", 1.0, 0.2),
        ("linear", 3.0, 0.2),  # clamped after total
        ("exponential", 0.5, math.sqrt(2.0 * 0.2)),
        ("exponential", 1.0, 0.2),
        ("cosine", 0.5, 1.1),
        ("cosine", 1.0, 0.2),
    ],
)
def test_schedule_values(schedule, progress, want):
    assert schedule_value(schedule, 2.0, 0.2, progress) == pytest.approx(want)


def test_steps_get_the_stated_values_and_are_logged(tmp_path):
    schedule = TemperatureSchedule(TAU, start=1.0, end=0.2, schedule="linear", total=4)
    trainer, model, seen = fit(schedule, tmp_path, max_steps=6)
    temps = [seen[t][1] for t in range(6)]
    assert temps == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.2])
    assert model.head.selection_temperature == pytest.approx(0.2)
    assert trainer.callback_metrics["selection_temperature"].item() == pytest.approx(0.2)


@pytest.mark.parametrize("interval", ["step", "epoch"])
def test_resume_from_a_checkpoint_gives_the_uninterrupted_values(tmp_path, interval):
    def make():
        if interval == "step":
            return TemperatureSchedule(TAU, start=2.0, end=0.1, schedule="cosine", total=7)
        return TemperatureSchedule(
            TAU, start=2.0, end=0.1, schedule="exponential", interval="epoch", total=2
        )

    _, _, full = fit(make(), tmp_path / "a", max_steps=10, ckpt_every=3)
    ckpt = torch.load(tmp_path / "a" / "step=6.ckpt", weights_only=False)
    schedule = make()
    assert ckpt["callbacks"][schedule.state_key]["clock"] == (5 if interval == "step" else 1)
    _, model, resumed = fit(
        schedule, tmp_path / "b", max_steps=10, ckpt_path=tmp_path / "a" / "step=6.ckpt"
    )
    assert sorted(resumed) == list(range(6, 10))
    for step in range(6, 10):
        assert resumed[step] == pytest.approx(full[step]), step
    assert len({full[t][1] for t in range(10)}) > 2  # the schedule moved
    assert model.head.selection_temperature == pytest.approx(full[9][1])
    if interval == "epoch":
        assert [full[t][1] for t in (0, 4, 8)] == pytest.approx([2.0, math.sqrt(0.2), 0.1])


def test_resuming_with_a_changed_schedule_warns():
    schedule = TemperatureSchedule(TAU, start=1.0, end=0.5, schedule="linear", total=10)
    with pytest.warns(UserWarning, match="this schedule gives 0.95"):
        schedule.load_state_dict({"value": 0.9, "clock": 1})
    schedule.load_state_dict({"value": 0.95, "clock": 1})  # no warning


def test_module_path_picks_one_module_and_discovery_finds_all(tmp_path):
    class TwoHeads(TinyModel):
        def __init__(self):
            super().__init__()
            self.other = TapasHead(
                30, 8, num_negatives=4, presample_factor=2, selection_temperature=3.0
            )
            self.plain = SampledSoftmaxHead(30, 8, num_negatives=4)

    model = TwoHeads()
    only = TemperatureSchedule(TAU, start=0.5, module_path="other")
    assert [m is model.other for m in only.targets(model)] == [True]
    assert only.log_name == "other.selection_temperature"
    every = TemperatureSchedule(TAU, start=0.5)
    assert {id(m) for m in every.targets(model)} == {id(model.head), id(model.other)}
    logits = TemperatureSchedule("temperature", start=0.5)  # every head's logit temperature
    assert {id(m) for m in logits.targets(model)} == {
        id(model.head),
        id(model.other),
        id(model.plain),
    }
    with pytest.raises(ValueError, match="no submodule"):
        TemperatureSchedule("tau", start=0.5).targets(model)
    with pytest.raises(ValueError, match="does not declare 'selection_temperature'"):
        TemperatureSchedule(TAU, start=0.5, module_path="plain").targets(model)
    with pytest.raises(ValueError, match="does not declare"):
        TemperatureSchedule(TAU, start=0.5, module_path="encoder").targets(model)


def test_the_attribute_is_named_explicitly():
    with pytest.raises(TypeError, match="attribute"):
        TemperatureSchedule(start=0.5)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="schedule"):
        TemperatureSchedule(TAU, start=1.0, end=0.1, schedule="step", total=3)
    with pytest.raises(ValueError, match="interval"):
        TemperatureSchedule(TAU, start=1.0, interval="batch")
    with pytest.raises(ValueError, match="end is required"):
        TemperatureSchedule(TAU, start=1.0, schedule="linear", total=3)
    with pytest.raises(ValueError, match="total"):
        TemperatureSchedule(TAU, start=1.0, end=0.1, schedule="linear")
    with pytest.raises(ValueError, match="total"):
        TemperatureSchedule(TAU, start=1.0, end=0.1, schedule="cosine", total=0)
    with pytest.raises(ValueError, match="start > 0 and end > 0"):
        TemperatureSchedule(TAU, start=1.0, end=0.0, schedule="exponential", total=3)
    with pytest.raises(ValueError, match="start"):
        TemperatureSchedule(TAU, start=math.nan)
    with pytest.raises(ValueError, match="constant"):
        TemperatureSchedule(TAU, start=1.0, end=2.0)
    with pytest.raises(ValueError, match="attribute"):
        TemperatureSchedule("not a name", start=1.0)
    with pytest.raises(ValueError, match="module_path"):
        TemperatureSchedule(TAU, start=1.0, module_path="")


def test_an_end_value_the_head_refuses_fails_at_fit_start_not_total_steps_later(tmp_path):
    """Issue 32, item 10: a linear schedule to temperature 0 used to fail at the step where it
    reached 0; now before the first step, and the attribute is left as it was."""
    schedule = TemperatureSchedule(
        "temperature", start=1.0, end=0.0, schedule="linear", total=10**6
    )
    model = TinyModel()
    with pytest.raises(ValueError, match=r"TemperatureSchedule\(temperature\): end=0.0 is refused"):
        schedule.on_fit_start(None, model)
    assert model.head.temperature == 1.0
    with pytest.raises(ValueError, match="end=0.0 is refused by TapasHead"):
        fit(schedule, tmp_path, max_steps=2)
