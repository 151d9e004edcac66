"""The one serializer of the conversation types (core/messages.py)."""

from __future__ import annotations

from corral.core.messages import Message, ToolCall, dump, dump_messages, load_messages

CALL = ToolCall("call_1", "add", '{"a": 1}')
CONVERSATION = [
    Message.system("be brief"),
    Message.user("add 1"),
    Message.assistant("", (CALL,)),
    Message.tool(CALL, "1", is_error=True),
    Message.assistant("done"),
]


def test_dump_messages_is_dump_of_the_list() -> None:
    assert dump_messages(CONVERSATION) == dump(CONVERSATION)
    assert dump_messages([]) == []


def test_dumped_messages_load_back() -> None:
    assert load_messages(dump_messages(CONVERSATION)) == CONVERSATION
