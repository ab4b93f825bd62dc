"""Custom pre/post-processing for the Hugging Face handler.

The input formatter accepts `{"question": "..."}` bodies (as well as the LMI `inputs` shape) and
wraps the question in the model's chat format; the output formatter answers with
`{"answer": ..., "tokens": n}` once the generation is finished.
"""

import json

from djl_handlers.custom_hooks import input_formatter, output_formatter
from djl_handlers.request.parser import decode_body


@input_formatter
def question_to_prompt(item, **kwargs):
    body = decode_body(item)
    if isinstance(body, dict) and "question" in body:
        prompt = f"<|im_start|>user\n{body['question']}<|im_end|>\n<|im_start|>assistant\n"
        return {"inputs": prompt, "parameters": body.get("parameters", {"max_new_tokens": 24})}
    return body


@output_formatter
def answer_only(out):
    if not out.finished:
        return ""
    return json.dumps({"answer": out.generated_text.strip(), "tokens": len(out.tokens)})
