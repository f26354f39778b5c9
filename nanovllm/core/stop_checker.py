"""A request's token-level stopping rules: stop and end-of-sequence tokens, min/max tokens, model length."""

from nanovllm.core.request import Request


class StopChecker:
    """Decides when a request is done, from its token ids alone (stop strings are the front end's)."""

    def __init__(self, eos_token_ids: tuple[int, ...], max_model_len: int):
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len

    def finish_reason(self, req: Request) -> str | None:
        """After `req`'s newest confirmed token: "stop", "length", or None to go on."""
        params = req.params
        num_output = len(req.token_ids) - req.num_prompt_tokens
        last = req.token_ids[-1]
        if num_output >= params.min_tokens and (
            last in params.stop_token_ids or (not params.ignore_eos and last in self.eos_token_ids)
        ):
            return "stop"
        if num_output >= params.max_tokens or len(req.token_ids) >= self.max_model_len:
            return "length"
        return None

    def has_all_tokens(self, req: Request) -> bool:
        """Whether `req` already has (or has in flight) every token its length limits allow,
        so that no step needs to run it again."""
        return req.num_output_tokens >= req.params.max_tokens or req.num_tokens >= self.max_model_len
