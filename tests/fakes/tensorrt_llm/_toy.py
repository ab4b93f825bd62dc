"""The fake TensorRT-LLM's toy model: shared with the fake vLLM (tests/fakes/fake_toy_model.py)."""

from fake_toy_model import EOS_ID, ToyTokenizer, beam_candidates, next_token, token_logprob

__all__ = ["EOS_ID", "ToyTokenizer", "beam_candidates", "next_token", "token_logprob"]
