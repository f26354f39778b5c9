"""Driving an engine step by step, and reading back what its requests completed."""


def run_steps(llm, outputs: dict, steps: int | None = None) -> dict:
    """Step `llm` (`steps` times, or until no request is left), keeping each request's latest
    RequestOutput in `outputs` by request id; returns `outputs`."""
    done = 0
    while llm.has_unfinished_requests() and (steps is None or done < steps):
        for output in llm.step():
            outputs[output.request_id] = output
        done += 1
    return outputs


def completions_of(outputs: dict, request_ids: list[str]) -> list:
    """The first completion of each request, in the order of `request_ids`."""
    return [outputs[request_id].outputs[0] for request_id in request_ids]
