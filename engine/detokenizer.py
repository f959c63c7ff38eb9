"""``IncrementalDetokenizer``: a sequence's output text, one token at a time, cut at stop strings.

Decoding runs through ``tokenizers``' ``DecodeStream`` (Rust; it holds back bytes of an unfinished UTF-8
character). Stop strings are searched only where the new text could complete one, and a text tail that could
still grow into a stop string is held back from ``emittable_text``, so a stream never shows part of a stop.
"""

from tokenizers.decoders import DecodeStream

from engine.sampling_params import SamplingParams

# Prompt tokens given to the stream as context, so the first output token decodes as it does after the prompt.
_PROMPT_CONTEXT = 8


class IncrementalDetokenizer:
    def __init__(self, backend_tokenizer, prompt_token_ids: list[int], params: SamplingParams):
        self._backend = backend_tokenizer
        self._stream = DecodeStream(
            ids=list(prompt_token_ids[-_PROMPT_CONTEXT:]), skip_special_tokens=params.skip_special_tokens
        )
        self._stops = params.stop
        self.text = ""
        self.stop_string: str | None = None  # the stop string that ended the text

    def append(self, token_id: int, *, check_stops: bool = True) -> bool:
        """Add one token's text; True when a stop string now ends the output (the text is cut before it)."""
        chunk = self._stream.step(self._backend, token_id)
        if not chunk:
            return False
        old_length = len(self.text)
        self.text += chunk
        if not (self._stops and check_stops):
            return False
        cut = None
        for stop in self._stops:
            at = self.text.find(stop, max(0, old_length - len(stop) + 1))
            if at != -1 and (cut is None or at < cut[0]):
                cut = (at, stop)
        if cut is None:
            return False
        self.text, self.stop_string = self.text[: cut[0]], cut[1]
        return True

    @property
    def emittable_text(self) -> str:
        """The text minus any tail that is the beginning of a stop string (it may still become one)."""
        held = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(self.text)), held, -1):
                if self.text.endswith(stop[:length]):
                    held = length
                    break
        return self.text[: len(self.text) - held] if held else self.text
