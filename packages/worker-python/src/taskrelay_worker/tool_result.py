"""What a handler returned, as the ``CallToolResult`` the task stores (``tool-result.ts``)."""

from __future__ import annotations

from typing import Any

from .errors import NonRetryableError
from .task_codec import _json
from .tool_definition import ToolDefinition

def to_tool_result(tool_def: ToolDefinition, value: Any) -> dict[str, Any]:
    """What a handler returned, as a ``CallToolResult`` (the Node worker's ``toToolResult``)."""
    if isinstance(value, str):
        return {"content": [{"type": "text", "text": value}]}
    if isinstance(value, dict) and isinstance(value.get("content"), list):
        for item in value["content"]:
            if not isinstance(item, dict) or not isinstance(item.get("type"), str):
                raise NonRetryableError(f"Tool {tool_def.name} returned an invalid result: each content item needs a type")
        return value
    if value is None:
        return {"content": []}
    if hasattr(value, "model_dump") and callable(value.model_dump):
        value = value.model_dump(mode="json")
    try:
        text = _json(value)
    except (TypeError, ValueError) as error:
        raise NonRetryableError(f"Tool {tool_def.name} returned a value that is not JSON: {error}") from None
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if isinstance(value, dict):
        result["structuredContent"] = value
    return result
