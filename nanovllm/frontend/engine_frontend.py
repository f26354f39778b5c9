"""What every front end holds: the config, the tokenizer, an engine client and the two processors."""

from itertools import count

from nanovllm.config import Config
from nanovllm.engine.engine_client import EngineClient
from nanovllm.engine.engine_core import EngineCore
from nanovllm.engine.messages import EngineCoreRequest
from nanovllm.frontend.input_processor import InputProcessor, Prompt
from nanovllm.frontend.output_processor import OutputProcessor, RequestState
from nanovllm.frontend.tokenizer import eos_token_ids, load_tokenizer
from nanovllm.sampling_params import SamplingParams


class EngineFrontend:
    """Text on this side, token ids on the engine core's.

    Builds the core for the model folder `model` (the `Config` fields as
    keywords; an unknown one is a ValueError that names it) and talks to it
    through a client of `client_class`. `eos_token_ids` are the end-of-sequence
    ids found in the folder, which the core stops on.
    """

    def __init__(self, model: str, client_class: type[EngineClient], **kwargs):
        self.config = Config.from_kwargs(model, **kwargs)
        self.tokenizer = load_tokenizer(self.config)
        self.eos_token_ids = eos_token_ids(self.config, self.tokenizer)
        self.engine_core = EngineCore(self.config, self.eos_token_ids)
        self.client = client_class(self.engine_core)
        self.input_processor = InputProcessor(self.tokenizer, self.client.info)
        self.output_processor = OutputProcessor()
        self._request_ids = count()

    def _check(self, prompt: Prompt, params: SamplingParams) -> EngineCoreRequest:
        """A checked request with a fresh id; ValueError if it cannot be served."""
        return self.input_processor.process(str(next(self._request_ids)), prompt, params)

    def _abort(self, request_id: str) -> RequestState | None:
        """End a live request with "abort" and drop it in the core; None if it already ended."""
        state = self.output_processor.finish(request_id, "abort")
        if state is not None:
            self.client.abort([request_id])
        return state

    def _submit(self, request: EngineCoreRequest) -> RequestState:
        """Hand a checked request to the core; returns its front-end state."""
        state = RequestState(request.request_id, request.prompt_token_ids, request.sampling_params, self.tokenizer)
        self.output_processor.add_request(state)
        self.client.add_request(request)
        return state
