"""ELMo biLM in pure PyTorch, compatible with bilm-tf / AllenNLP weights (see docs/architecture.md)."""

from elmo_model.bilm import BiLM, BiLMOutput
from elmo_model.characters import batch_to_ids, token_mask, token_to_ids, tokens_to_ids
from elmo_model.elmo import Elmo, remove_sentence_boundaries
from elmo_model.lstm import LSTMState, StackedBiLSTM
from elmo_model.options import BiLMOptions, OptionsError
from elmo_model.scalar_mix import ScalarMix
from elmo_model.token_cache import TokenCache
from elmo_model.token_encoder import TokenEncoder
from elmo_model.training_lm import TrainingLM
from elmo_model.weights import WeightsError, load_weights, save_weights

__all__ = [
    "BiLM",
    "BiLMOptions",
    "BiLMOutput",
    "Elmo",
    "LSTMState",
    "OptionsError",
    "ScalarMix",
    "StackedBiLSTM",
    "TokenCache",
    "TokenEncoder",
    "TrainingLM",
    "WeightsError",
    "batch_to_ids",
    "load_weights",
    "remove_sentence_boundaries",
    "save_weights",
    "token_mask",
    "token_to_ids",
    "tokens_to_ids",
]
