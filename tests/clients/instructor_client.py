"""Run by tests/api/test_instructor.py in its own virtualenv (instructor pins an older `jiter`
than the `openai` release the rest of the suite uses): one structured reply from our
server through instructor, printed as JSON.

    python instructor_client.py BASE_URL TOOLS|JSON_SCHEMA
"""

import json
import sys

import instructor
import openai
from pydantic import BaseModel


class Verse(BaseModel):
    """A verse of the King James Bible."""

    book: str
    chapter: int
    verse: int


base_url, mode = sys.argv[1], sys.argv[2]
client = instructor.from_openai(openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0),
                                mode=instructor.Mode[mode])
verse, completion = client.chat.completions.create_with_completion(
    model="demo", response_model=Verse, max_retries=0, temperature=0, max_tokens=64,
    messages=[{"role": "user", "content": "Which verse says: Whither thou goest, I will go?"}])
message = completion.choices[0].message
print(json.dumps({"verse": verse.model_dump(), "finish_reason": completion.choices[0].finish_reason,
                  "tool_calls": [c.function.name for c in message.tool_calls or []],
                  "completion_tokens": completion.usage.completion_tokens}))
