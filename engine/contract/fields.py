"""The OpenAI request fields this platform takes, with the type each value must have, and the bounds of its lists.

OpenAI fields that would change the answer but that are not implemented are refused by name, never silently
ignored; fields that change nothing here (``user``, ``metadata``, ``store``) are accepted; anything else unknown is
refused too, so a typo never passes unnoticed. The engine-only extensions are set by the gateway from the tenant
(ENGINE_PROTOCOL.md): a client of the gateway cannot send them.
"""

_NONE = type(None)
_NUMBER = (int, float, _NONE)

COMMON = {
    "model": (str,), "max_tokens": (int, _NONE), "temperature": _NUMBER, "top_p": _NUMBER, "n": (int, _NONE),
    "stream": (bool, _NONE), "stream_options": (dict, _NONE), "stop": (str, list, _NONE), "seed": (int, _NONE),
    "presence_penalty": _NUMBER, "frequency_penalty": _NUMBER, "user": (str, _NONE), "metadata": (dict, _NONE),
    # the engine's sampling extensions (vLLM's names)
    "ignore_eos": (bool,), "min_tokens": (int,), "top_k": (int,), "min_p": (int, float),
    "repetition_penalty": (int, float), "stop_token_ids": (list, _NONE),
    "structured_outputs": (dict, _NONE),  # vLLM's: json, regex, choice, grammar, json_object
}
COMPLETION = {**COMMON, "prompt": (str, list), "logprobs": (int, _NONE), "echo": (bool, _NONE),
              "best_of": (int, _NONE), "suffix": (str, _NONE)}
CHAT = {**COMMON, "messages": (list,), "logprobs": (bool, _NONE), "top_logprobs": (int, _NONE),
        "max_completion_tokens": (int, _NONE), "response_format": (dict, _NONE), "store": (bool, _NONE),
        "parallel_tool_calls": (bool, _NONE), "tools": (list, _NONE), "tool_choice": (str, dict, _NONE)}
# Set by the gateway only. ``prompt_token_ids`` (chat): the messages as /tokenize encoded them, sent instead of
# the messages so that the engine never encodes a prompt the gateway counted.
ENGINE_EXTENSIONS = {"adapter": (dict, _NONE), "fairness_key": (str, _NONE), "cache_salt": (str, _NONE),
                     "fairness_weight": _NUMBER, "priority": (str, _NONE)}
CHAT_ENGINE_EXTENSIONS = {"prompt_token_ids": (list,)}
UNSUPPORTED = {"functions", "function_call", "logit_bias", "audio", "modalities",
               "prediction", "web_search_options", "reasoning_effort", "service_tier"}
SAMPLING = ("temperature", "top_p", "n", "seed", "presence_penalty", "frequency_penalty", "ignore_eos", "min_tokens",
            "top_k", "min_p", "repetition_penalty", "stop_token_ids")

MAX_CHOICES = 16  # prompts x n of one request
MAX_LOGPROBS = 20
MAX_STOPS, MAX_STOP_CHARS = 16, 512
MAX_STOP_TOKEN_IDS = 256
MAX_PROMPT_TOKEN_IDS = 131_072  # per token-id prompt: past any context this platform serves
MAX_TOKEN_ID = 2**31 - 1
MAX_MESSAGES = 2048
MAX_CACHE_SALT_CHARS = 256
MESSAGE_ROLES = {"system", "user", "assistant", "developer", "tool"}
# A constraint's size and nesting (a schema's, a grammar's text): bigger ones are refused before any compile.
MAX_CONSTRAINT_CHARS = 64 * 1024
MAX_SCHEMA_DEPTH = 32
