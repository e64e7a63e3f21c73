"""The rollouts' written-out samplers against torch.distributions (every script that has one)."""

import glob
import os

import pytest
import torch
from conftest import ROOT, import_script

SCRIPTS = sorted(
    os.path.basename(p)[: -len(".py")] for pattern in ("ppo_*.py", "ppg_*.py") for p in glob.glob(os.path.join(ROOT, pattern))
)
WITH_CATEGORICAL = [name for name in SCRIPTS if hasattr(import_script(name), "sample_categorical")]


def test_the_small_network_scripts_have_a_written_out_sampler():
    assert {"ppo_fsmn_cartpole", "ppg_lunarlander"} <= set(WITH_CATEGORICAL)


@pytest.mark.parametrize("script", WITH_CATEGORICAL)
def test_sample_categorical_matches_categorical(script):
    """The same log-probabilities as Categorical's, and action frequencies within 5 standard errors of Categorical's
    probabilities over 200k draws (so a wrong noise, or an argmin, fails)."""
    torch.manual_seed(0)
    logits = torch.tensor([[0.0, 1.0, -2.0, 0.5], [3.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    reference = torch.distributions.Categorical(logits=logits)
    draws = 200_000
    actions, logprobs = import_script(script).sample_categorical(logits.repeat(draws, 1))
    torch.testing.assert_close(logprobs, reference.log_prob(actions.view(draws, 3)).flatten())
    frequencies = torch.nn.functional.one_hot(actions.view(draws, 3), 4).double().mean(0)  # (3, 4)
    probs = reference.probs.double()
    standard_error = (probs * (1 - probs) / draws).sqrt()
    assert ((frequencies - probs).abs() <= 5 * standard_error + 1e-12).all(), (frequencies, probs)
