"""The `lookup` tool of the built-in tool task (`builtin://code_lookup`, examples/tool_lookup.yaml):
a verl BaseTool that answers the 3-digit code of the sample's number, which it receives through
verl's per-sample `tools_kwargs` (`create_kwargs: {number}`), so the model calls it without
arguments. The code is the same as runtime/src/data/builtin.rs's `lookup_code`."""
import uuid

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse


def lookup_code(number: int) -> str:
    return f"{(number * 7919 + 104729) % 1000:03d}"


class CodeLookupTool(BaseTool):
    def __init__(self, config, tool_schema):
        super().__init__(config, tool_schema)
        self._numbers = {}

    async def create(self, instance_id=None, create_kwargs=None, **kwargs):
        instance_id = instance_id or str(uuid.uuid4())
        self._numbers[instance_id] = int((create_kwargs or {}).get("number", 0))
        return instance_id, ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=lookup_code(self._numbers[instance_id])), 0.0, {}

    async def release(self, instance_id, **kwargs):
        self._numbers.pop(instance_id, None)
