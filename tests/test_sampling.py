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


WITH_LOG_PROB_ENTROPY = [name for name in SCRIPTS if hasattr(import_script(name), "categorical_log_prob_entropy")]


def test_the_fsmn_has_a_written_out_log_prob_and_entropy():
    assert "ppo_fsmn_cartpole" in WITH_LOG_PROB_ENTROPY


@pytest.mark.parametrize("script", WITH_LOG_PROB_ENTROPY)
def test_categorical_log_prob_entropy_matches_categorical(script):
    """Log-probabilities, entropies and their gradients as Categorical's, on (T, B, actions) logits with a
    near-certain row and a row with a -inf logit (its entropy finite, as Categorical keeps it); that action taken,
    the log-probability -inf, as Categorical's."""
    torch.manual_seed(0)
    logits = torch.randn(6, 3, 4) * 3
    logits[0, 0] = torch.tensor([40.0, -40.0, 0.0, 1.0])
    logits[1, 1, 2] = -torch.inf
    actions = torch.randint(0, 4, (6, 3))
    actions[1, 1] = 1
    mine, reference = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    logprob, entropy = import_script(script).categorical_log_prob_entropy(mine, actions)
    distribution = torch.distributions.Categorical(logits=reference)
    torch.testing.assert_close(logprob, distribution.log_prob(actions))
    torch.testing.assert_close(entropy, distribution.entropy())
    assert torch.isfinite(entropy).all()
    (logprob.sum() + 0.1 * entropy.sum()).backward()
    (distribution.log_prob(actions).sum() + 0.1 * distribution.entropy().sum()).backward()
    torch.testing.assert_close(mine.grad, reference.grad)
    actions[1, 1] = 2  # the action of probability 0
    logprob, _ = import_script(script).categorical_log_prob_entropy(logits, actions)
    torch.testing.assert_close(logprob, torch.distributions.Categorical(logits=logits).log_prob(actions))
    assert logprob[1, 1] == -torch.inf
