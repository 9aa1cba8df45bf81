"""A chat template split at its message loop (``workloads.convert.template_parts``) gives the pieces,
turns and problems of whole renders: random chats through ``plan_chat`` both ways, over templates
that split (the tests' Llama-3-style one, ChatML, tails that write on either side of the generation
prompt, a raising role check) and the shapes the split must refuse; the same with the messages of
many chats rendered ahead in one call (``ChatTemplate.prefill``, what a batch does)."""

from __future__ import annotations

import pytest
from convert_tokenizer import LLAMA3_STYLE_TEMPLATE
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.convert.chat_template import ChatTemplate, _environment
from workloads.convert.conversation import Chat, plan_chat
from workloads.convert.template_parts import message_rows, resolve_rows, split_template
from workloads.convert.tokenizer import APPROX_TEMPLATE
from workloads.trace_json import FieldProblem

SPLITTING = {
    "llama3": LLAMA3_STYLE_TEMPLATE,
    "chatml": APPROX_TEMPLATE,
    # the tail writes after the history when no generation prompt is asked: not prefix-stable
    "tail_without_gen": "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
                        "{% if add_generation_prompt %}[assistant]{% else %}<end>{% endif %}",
    # an assistant body that does not start with the generation prompt
    "answer_elsewhere": "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }};{% endfor %}"
                        "{% if add_generation_prompt %}assistant:{% endif %}",
    # refuses a role (raise_exception in the body, on a line of its own)
    "raising": "{{ bos_token }}{% for m in messages %}\n{% if m['role'] == 'tool' %}\n"
               "{{ raise_exception('no tools here') }}\n{% endif %}\n{{ m['role'] }}: {{ m['content'] | trim }}\n"
               "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}",
}

REFUSED = {
    "position": "{% for m in messages %}{% if loop.first %}^{% endif %}{{ m.content }}{% endfor %}",
    "state": "{% set ns = namespace(n=0) %}{% for m in messages %}{{ m.content }}{% endfor %}",
    "head_reads_messages": "{% if messages[0].role == 'system' %}S{% endif %}{% for m in messages %}{{ m.content }}"
                           "{% endfor %}",
    "whole_message": "{% for m in messages %}{{ m | tojson }}{% endfor %}",
    "dict_attribute": "{% for m in messages %}{{ m.items() }}{% endfor %}",
    "variable_key": "{% for m in messages %}{{ m[m.role] }}{% endfor %}",
    "break": "{% for m in messages %}{{ m.content }}{% break %}{% endfor %}",
    "two_loops": "{% for m in messages %}{{ m.content }}{% endfor %}{% for m in messages %}{{ m.role }}{% endfor %}",
    "tools_in_body": "{% for m in messages %}{{ tools }}{{ m.content }}{% endfor %}",
    "nested_loop": "{% for m in messages %}{% for c in m.content %}{{ c }}{% endfor %}{% endfor %}",
    "clock": "{{ strftime_now('%Y') }}{% for m in messages %}{{ m.content }}{% endfor %}",
    "gen_in_body": "{% for m in messages %}{{ m.content }}{{ add_generation_prompt }}{% endfor %}",
}


@pytest.mark.parametrize("name", sorted(SPLITTING))
def test_templates_of_the_shape_split(name: str) -> None:
    assert split_template(_environment(), SPLITTING[name]) is not None


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_other_shapes_render_whole(name: str) -> None:
    assert split_template(_environment(), REFUSED[name]) is None


_text = st.lists(st.sampled_from(["a", " b", "  ", "\n", "é", "<x>", "{{", "%}"]), max_size=4).map("".join)
_message = st.builds(lambda role, content: {"role": role, "content": content},
                     st.sampled_from(["system", "user", "assistant", "tool"]), _text)
_chat = st.builds(
    lambda messages, answer, tools: Chat("c", messages, tools=tools, answer_text=answer),
    st.lists(_message, min_size=1, max_size=6), st.one_of(st.none(), _text),
    st.one_of(st.none(), st.just([{"name": "f"}])))


def _plan(template: ChatTemplate, chat: Chat, turns: str, parts: bool,
          bodies: list[str] | None = None) -> tuple[object, ...]:
    try:
        plan = plan_chat(chat, template, turns, 7, parts, bodies)  # type: ignore[arg-type]
    except FieldProblem as exc:
        return ("problem", exc.field, exc.problem)
    return plan.pieces, [(t.prompt_pieces, t.answer_piece, t.answer_tokens) for t in plan.turns], plan.defaulted


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(SPLITTING)), st.lists(_chat, min_size=1, max_size=4),
       st.sampled_from(["all", "last", "first"]))
def test_split_plans_equal_whole_renders(name: str, chats: list[Chat], turns: str) -> None:
    """Pieces, turns and problems equal, chat after chat on one template (its message cache warm)."""
    split = ChatTemplate({"default": SPLITTING[name]}, {"bos_token": "<s>"})
    whole = ChatTemplate({"default": SPLITTING[name]}, {"bos_token": "<s>"})
    assert split.parts(chats[0].messages) is not None
    for chat in chats:
        assert _plan(split, chat, turns, True) == _plan(whole, chat, turns, False)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(SPLITTING)), st.lists(_chat, min_size=1, max_size=5),
       st.sampled_from(["all", "last", "first"]))
def test_prefilled_plans_equal_whole_renders(name: str, chats: list[Chat], turns: str) -> None:
    """The messages of every chat rendered ahead (raising ones among them skipped) and handed to
    each chat's plan change no piece, turn or problem of any chat; a chat whose messages cannot
    all be given gets None and renders its own."""
    split = ChatTemplate({"default": SPLITTING[name]}, {"bos_token": "<s>"})
    whole = ChatTemplate({"default": SPLITTING[name]}, {"bos_token": "<s>"})
    given = split.prefill([(chat.messages, chat.tools) for chat in chats])
    assert len(given) == len(chats)
    for chat, bodies in zip(chats, given, strict=True):
        assert bodies is None or len(bodies) == len(chat.messages)
        assert _plan(split, chat, turns, True, bodies) == _plan(whole, chat, turns, False)


def test_prefill_skips_a_raising_message_and_renders_the_rest() -> None:
    template = ChatTemplate({"default": SPLITTING["raising"]}, {"bos_token": "<s>"})
    messages = [{"role": "user", "content": "q"}, {"role": "tool", "content": "t"},
                {"role": "assistant", "content": "a"}, {"role": "tool", "content": "u"},
                {"role": "user", "content": "z"}]
    given = template.prefill([(messages[:3], None), (messages[4:], None), ([{"role": "user", "content": None}], None)])
    parts = template._parts["default"]
    assert parts is not None
    assert sorted(parts._cache) == [("a", "assistant"), ("q", "user"), ("z", "user")]
    assert given == [None, ["user: z\n"], None]  # a raising message, then one not cached by its keys


def test_a_raising_message_gives_the_whole_renders_problem_and_line() -> None:
    template = ChatTemplate({"default": SPLITTING["raising"]}, {"bos_token": "<s>"})
    chat = Chat("c", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                      {"role": "tool", "content": "t"}, {"role": "assistant", "content": "b"}])
    got = _plan(template, chat, "all", True)
    assert got == _plan(template, chat, "all", False)
    assert got[0] == "problem" and "template line 3" in str(got[2]) and "no tools here" in str(got[2])
    # the first turn alone never reaches the tool message: no problem either way
    assert _plan(template, chat, "first", True) == _plan(template, chat, "first", False) != got


def test_message_texts_are_cached_by_the_keys_read() -> None:
    template = ChatTemplate({"default": SPLITTING["chatml"]})
    parts = template._parts["default"]
    assert parts is not None and parts.keys == ("content", "role")
    chat = Chat("c", [{"role": "user", "content": "q", "name": "x"}, {"role": "assistant", "content": None}])
    plan_chat(chat, template, "all", 7)
    assert list(parts._cache) == [("q", "user")]  # a None content is rendered each time, not cached


_field = st.one_of(st.sampled_from(["a", "b", ""]), st.none(), st.integers(0, 1), st.just(["x"]))
_loose_message = st.one_of(
    st.fixed_dictionaries({"role": _field, "content": _field}, optional={"name": st.just("n")}),
    st.fixed_dictionaries({"role": _field}), st.just("not a dict"))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_loose_message, max_size=4), max_size=4), st.data())
def test_the_compiled_rows_equal_their_definitions(chats: list[list[object]], data: st.DataObject) -> None:
    word_scan = pytest.importorskip("workloads.convert.word_scan")
    keys = ("content", "role")
    cache = {(c, r): f"{r}:{c}" for c in "ab" for r in "ab" if data.draw(st.booleans())}
    rows, todo = word_scan.message_rows(chats, keys, cache)
    want_rows, want_todo = message_rows(chats, keys, cache)  # type: ignore[arg-type]
    assert rows == want_rows
    assert list(todo) == list(want_todo) and all(todo[k] is want_todo[k] for k in todo)
    rendered = {key: f"<{key}>" for key in todo if data.draw(st.integers(0, 3))}
    assert word_scan.resolve_rows(rows, rendered) == resolve_rows(want_rows, rendered)
