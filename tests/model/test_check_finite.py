"""The opt-in finite check of a forward's output (model/lab.py: finite_check; Lab.forward and DecoderModel.forward
take check_finite=True): NaN or inf planted at a layer and row is a NonFiniteOutputError naming both, and the
default forward adds no host-device sync (the sync audit counts none)."""
import pytest
import torch

from lora_moe_lab.audit import audit
from lora_moe_lab.model.decoder import build_decoder_lab
from lora_moe_lab.model.lab import NonFiniteOutputError, build_lab

BUILDS = {"moe": build_lab, "decoder": build_decoder_lab}


def _lab(kind, layers=2):
    lab = BUILDS[kind]("tiny", num_layers=layers, device="cpu", backend="torch", dtype="float32",
                       seed=int(torch.randint(0, 2**31 - 1, ())))
    lab.pool.load("a0", rank=4)
    batch, tensors = lab.make_batch([None, "a0"], [3, 5])
    return lab, batch, tensors, lab.random_input(8, seed=int(torch.randint(0, 2**31 - 1, ())))


@pytest.mark.parametrize("kind", list(BUILDS))
def test_a_planted_nan_names_its_layer_and_first_row(kind):
    lab, batch, tensors, x = _lab(kind)
    layer, row = 1, int(torch.randint(0, 8, ()))

    def plant(mod, args, out):  # registered before the check's own hooks, so it runs first
        out[row, int(torch.randint(0, out.shape[1], ()))] = float("nan")

    h = lab.model.layers[layer].register_forward_hook(plant)
    try:
        assert lab.model(x, batch, tensors)[row].isnan().any()  # unchecked, the NaN passes silently
        checked = (lambda: lab.forward(x, batch, tensors, check_finite=True)) if kind == "moe" else (
            lambda: lab.model(x, batch, tensors, check_finite=True))  # the lab's entry, and the decoder's own
        with pytest.raises(NonFiniteOutputError, match=rf"layer {layer} .*first at row {row} "):
            checked()
    finally:
        h.remove()
    assert not any(layer._forward_hooks for layer in lab.model.layers)  # the check leaves no hook behind


def test_an_adapter_with_nan_weights_is_named_at_its_layer_and_first_token():
    lab, batch, tensors, x = _lab("moe")
    slot = lab.pool.slot_of("a0")
    lab.pool.layers[1].down_b[slot, :, 0, 0] = float("inf")  # written past load's checks, as a corrupted pool would be
    lab.pool.layers[1].refresh_derived()
    with pytest.raises(NonFiniteOutputError, match=r"layer 1 .*first at row 3 "):  # a0's tokens start at row 3
        lab.forward(x, batch, tensors, check_finite=True)


def test_a_non_finite_input_is_named_before_layer_zero():
    lab, batch, tensors, x = _lab("moe", layers=1)
    x[6, 0] = float("-inf")
    with pytest.raises(NonFiniteOutputError, match=r"input x is not finite at row 6 "):
        lab.forward(x, batch, tensors, check_finite=True)


@pytest.mark.parametrize("kind", list(BUILDS))
def test_a_check_finite_that_is_not_a_bool_is_named(kind):
    lab, batch, tensors, x = _lab(kind, layers=1)
    with pytest.raises(ValueError, match="check_finite must be True or False, got 'no'"):
        lab.forward(x, batch, tensors, check_finite="no")


def test_the_default_forward_adds_no_sync():
    lab, batch, tensors, x = _lab("moe")
    checked = lab.forward(x, batch, tensors, check_finite=True)
    torch.testing.assert_close(checked, lab.model(x, batch, tensors), rtol=0, atol=0)  # the same forward
    rep = audit(lab.forward, x, batch, tensors, warmup=0, reps=1, profile=False, estimator=None)
    assert rep.count == 0, rep.summary()
