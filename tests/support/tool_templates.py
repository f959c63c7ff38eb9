"""Chat templates with a tool format, for tests: Qwen2.5's Hermes-style one, condensed (same tool prompt, same
call and tool-result rendering)."""

HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}You are a helpful assistant."
    "{% endif %}{{ '\\n' }}\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n"
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant"
    "{% if message.content %}{{ '\\n' }}{{ message.content }}{% endif %}"
    "{% for tool_call in message.tool_calls %}{% set call = tool_call.function %}"
    "{{ '\\n' }}<tool_call>\n{\"name\": \"{{ call.name }}\", "
    "\"arguments\": {{ call.arguments | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Llama 3.1's JSON tool calls: the template renders tools, in a syntax this engine has no parser for.
OTHER_FORMAT_TEMPLATE = (
    "{% if tools %}Respond with {\"name\": function name, \"parameters\": dictionary}.{{ tools | tojson }}"
    "{% endif %}{% for message in messages %}{{ message['content'] }}{% endfor %}"
)
