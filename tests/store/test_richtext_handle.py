"""Rich text fields and `collection.richtext(id, field)` handles (SPEC 2.4, DESIGN.md section 2)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from offline import INVALID_OPERATION, OfflineError, create_app, define_schema, t
from offline.merge import richtext
from offline.store import App, RichTextHandle

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "docs": {"fields": {"title": t.string(), "notes": t.richtext(), "summary": t.richtext()}},
        },
    }
)


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "app.db")


@pytest.fixture
def app(path: str) -> Iterator[App]:
    application = create_app(SCHEMA, path=path)
    yield application
    application.close()


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[App]:
    application = create_app(SCHEMA, path=str(tmp_path / "peer.db"))
    yield application
    application.close()


def test_richtext_starts_empty(app: App) -> None:
    record = app.docs.insert({"title": "d"})
    assert record["notes"] == ""
    handle = app.docs.richtext(record["id"], "notes")
    assert isinstance(handle, RichTextHandle)
    assert str(handle) == ""
    assert len(handle) == 0


def test_insert_with_initial_text(app: App) -> None:
    record = app.docs.insert({"title": "d", "notes": "hello"})
    assert record["notes"] == "hello"
    assert str(app.docs.richtext(record["id"], "notes")) == "hello"
    assert app.docs.find_by_id(record["id"])["notes"] == "hello"
    assert app.docs.where({}).first()["notes"] == "hello"


def test_handle_insert_delete_and_str(app: App) -> None:
    record = app.docs.insert({"title": "d"})
    handle = app.docs.richtext(record["id"], "notes")
    after = handle.insert(0, "world")
    assert after["notes"] == "world"
    handle.insert(0, "hello ")
    handle.insert(len(handle), "!")
    assert str(handle) == "hello world!"
    assert app.docs.find_by_id(record["id"])["notes"] == "hello world!"
    after = handle.delete(0, 6)
    assert after["notes"] == "world!"
    handle.delete(5, 1)
    assert str(handle) == "world"
    handle.insert(2, "--")
    assert str(handle) == "wo--rld"
    # Every edit is an update operation carrying its Yjs update, and not the previous text: a keystroke's
    # operation stays the size of the keystroke, however long the document (the merge of rich text never
    # reads previousData; a conflict trace's base is then unavailable, null).
    ops = app.operations()
    assert [o.type for o in ops] == ["insert"] + ["update"] * 6
    assert dict(ops[-1].previous_data) == {}
    assert isinstance(dict(ops[-1].data)["notes"], bytes)


def test_record_and_queries_show_current_text(app: App) -> None:
    record = app.docs.insert({"title": "d"})
    handle = app.docs.richtext(record["id"], "notes")
    handle.insert(0, "abc")
    assert app.docs.find_by_id(record["id"])["notes"] == "abc"
    assert [r["notes"] for r in app.docs.where({"title": "d"}).fetch()] == ["abc"]
    # The other rich text field is independent.
    assert app.docs.find_by_id(record["id"])["summary"] == ""


@pytest.mark.parametrize("text", ["héllo wörld ✓", "日本語のテキスト", "a😀b🎉c", "ascii only"])
def test_indices_count_characters_whatever_the_text(app: App, text: str) -> None:
    record = app.docs.insert({"title": "d"})
    handle = app.docs.richtext(record["id"], "notes")
    handle.insert(0, text)
    assert str(handle) == text
    assert len(handle) == len(text)
    expected = text
    for index, piece in [(3, "<X>"), (len(expected) + 3, "$"), (1, "é")]:
        handle.insert(index, piece)
        expected = expected[:index] + piece + expected[index:]
        assert str(handle) == expected
    for index, length in [(2, 3), (0, 1), (len(expected) - 6, 2)]:
        handle.delete(index, length)
        expected = expected[:index] + expected[index + length :]
        assert str(handle) == expected
    assert app.docs.find_by_id(record["id"])["notes"] == expected
    # A non-ASCII text can be replaced as a whole, then edited again.
    app.docs.update(record["id"], {"notes": "ünï"})
    handle.insert(2, "-")
    assert str(handle) == "ün-ï"


def test_initial_non_ascii_text_then_edit(app: App) -> None:
    record = app.docs.insert({"title": "d", "notes": "ça va"})
    handle = app.docs.richtext(record["id"], "notes")
    handle.insert(2, "!")
    handle.delete(0, 1)
    assert str(handle) == "a! va"


@pytest.mark.parametrize("index", [-1, 4, 100])
def test_insert_out_of_bounds(app: App, index: int) -> None:
    record = app.docs.insert({"title": "d", "notes": "abc"})
    handle = app.docs.richtext(record["id"], "notes")
    with pytest.raises(OfflineError) as info:
        handle.insert(index, "x")
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None and info.value.context["field"] == "notes"
    assert str(handle) == "abc"
    assert len(app.operations()) == 1


@pytest.mark.parametrize(("index", "length"), [(-1, 1), (0, 4), (2, 2), (3, 1), (0, -1)])
def test_delete_out_of_bounds(app: App, index: int, length: int) -> None:
    record = app.docs.insert({"title": "d", "notes": "abc"})
    handle = app.docs.richtext(record["id"], "notes")
    with pytest.raises(OfflineError) as info:
        handle.delete(index, length)
    assert info.value.code == INVALID_OPERATION
    assert str(handle) == "abc"
    assert len(app.operations()) == 1


def test_empty_edits_create_no_operation(app: App) -> None:
    record = app.docs.insert({"title": "d", "notes": "abc"})
    handle = app.docs.richtext(record["id"], "notes")
    handle.insert(1, "")
    handle.delete(1, 0)
    assert str(handle) == "abc"
    assert len(app.operations()) == 1


def test_insert_takes_a_string(app: App) -> None:
    record = app.docs.insert({"title": "d"})
    with pytest.raises(OfflineError) as info:
        app.docs.richtext(record["id"], "notes").insert(0, 5)  # type: ignore[arg-type]
    assert info.value.code == INVALID_OPERATION


def test_handle_on_a_missing_record(app: App) -> None:
    handle = app.docs.richtext("missing", "notes")
    assert str(handle) == ""
    with pytest.raises(OfflineError) as info:
        handle.insert(0, "x")
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None and info.value.context["reason"] == "NOT_FOUND"


@pytest.mark.parametrize("field", ["title", "missing"])
def test_handle_only_for_richtext_fields(app: App, field: str) -> None:
    record = app.docs.insert({"title": "d"})
    with pytest.raises(OfflineError) as info:
        app.docs.richtext(record["id"], field)
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None and info.value.context["field"] == field


def test_replace_whole_text_with_update(app: App) -> None:
    record = app.docs.insert({"title": "d", "notes": "old text"})
    handle = app.docs.richtext(record["id"], "notes")
    handle.insert(0, ">> ")
    updated = app.docs.update(record["id"], {"notes": "new"})
    assert updated["notes"] == "new"
    assert str(handle) == "new"
    assert dict(app.operations()[-1].previous_data) == {"notes": ">> old text"}
    # Clearing it, and editing after a replace.
    handle.insert(3, "er")
    assert str(handle) == "newer"
    assert app.docs.update(record["id"], {"notes": ""})["notes"] == ""
    assert app.docs.update(record["id"], {"notes": None})["notes"] == ""
    # Setting the same text again is a no-op.
    app.docs.update(record["id"], {"notes": "x"})
    count = len(app.operations())
    app.docs.update(record["id"], {"notes": "x"})
    assert len(app.operations()) == count


def test_text_survives_restart(path: str) -> None:
    with create_app(SCHEMA, path=path) as app:
        record = app.docs.insert({"title": "d", "notes": "hello"})
        handle = app.docs.richtext(record["id"], "notes")
        handle.insert(5, " world")
        app.docs.richtext(record["id"], "summary").insert(0, "sum")
    with create_app(SCHEMA, path=path) as app:
        handle = app.docs.richtext(record["id"], "notes")
        assert str(handle) == "hello world"
        assert app.docs.find_by_id(record["id"])["summary"] == "sum"
        # Editing continues from the stored document.
        handle.delete(0, 6)
        handle.insert(5, "!")
        assert str(handle) == "world!"
    with create_app(SCHEMA, path=path) as app:
        assert app.docs.find_by_id(record["id"])["notes"] == "world!"


def test_concurrent_edits_merge(app: App, peer: App) -> None:
    record = app.docs.insert({"title": "d", "notes": "middle"})
    peer.apply(app.operations())
    app.docs.richtext(record["id"], "notes").insert(0, "start ")
    peer.docs.richtext(record["id"], "notes").insert(6, " end")
    app.apply(peer.operations(after=app.version_vector))
    peer.apply(app.operations(after=peer.version_vector))
    assert app.docs.find_by_id(record["id"])["notes"] == "start middle end"
    assert peer.docs.find_by_id(record["id"])["notes"] == "start middle end"


def _pycrdt_typing_bytes(text: str) -> int:
    """What one pycrdt document holds after ``text`` was typed into it one character at a time."""
    import pycrdt

    doc = pycrdt.Doc()
    typed = doc.get("text", type=pycrdt.Text)
    for i, char in enumerate(text):
        typed.insert(i, char)
    return len(doc.get_update())


def test_typing_is_stored_as_one_document_of_one_yjs_client(app: App) -> None:
    """One node's keystrokes are one Yjs client's run: the stored document is about the size one pycrdt
    document holds for the same typing (a new client per edit made it 21 times larger)."""
    record = app.docs.insert({"title": "d", "notes": ""})
    handle = app.docs.richtext(record["id"], "notes")
    typed = "the quick brown fox jumps over the lazy dog " * 8
    for char in typed:
        handle.insert(len(handle), char)
    app.flush()
    state = app.cached_state("docs", record["id"])
    assert state is not None
    stored = richtext.decode_state(state.fields["notes"]["s"])
    assert stored is not None

    assert str(handle) == typed
    assert len(stored) <= 2 * _pycrdt_typing_bytes(typed)
    assert _clients(stored) == [richtext.client_id_for(app.node_id)]  # one client: this node's
    other = app.docs.insert({"title": "e", "notes": "x"})
    app.docs.richtext(other["id"], "notes").insert(1, "y")
    state = app.cached_state("docs", other["id"])
    assert state is not None
    assert _clients(richtext.decode_state(state.fields["notes"]["s"]) or b"") == _clients(stored)


def _clients(update: bytes) -> list[int]:
    """The Yjs client ids in an update's state vector (count, then client and clock, as varints)."""
    import pycrdt

    vector = bytes(pycrdt.get_state(update))
    numbers: list[int] = []
    value = shift = 0
    for byte in vector:
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            numbers.append(value)
            value = shift = 0
    return numbers[1::2]


def test_two_users_typing_concurrently_converge_holding_both(app: App, peer: App) -> None:
    record = app.docs.insert({"title": "d", "notes": "|"})
    peer.apply(app.operations())
    mine, theirs = app.docs.richtext(record["id"], "notes"), peer.docs.richtext(record["id"], "notes")
    for i, char in enumerate("left side "):
        mine.insert(i, char)
        theirs.insert(len(theirs), "right side"[i])
        if i % 4 == 3:  # exchange now and then, as a connection that comes and goes
            app.apply(peer.operations(after=app.version_vector))
            peer.apply(app.operations(after=peer.version_vector))
    theirs.insert(len(theirs), "!")
    app.apply(peer.operations(after=app.version_vector))
    peer.apply(app.operations(after=peer.version_vector))

    text = app.docs.find_by_id(record["id"])["notes"]
    assert text == peer.docs.find_by_id(record["id"])["notes"]
    assert text == "left side |right side!"


def _edits_with_remote_updates(app_path: str, peer_path: str) -> list[tuple[str, bytes, str]]:
    """One history of local edits interleaved with a peer's updates, a refused edit, a rebuild and a
    reopen; after each step, what is stored for the record's text (the merge state's document, the row's
    state bytes) and its text."""
    steps: list[tuple[str, bytes, str]] = []

    def snapshot(app: App, record_id: str) -> None:
        app.flush()
        state = app.cached_state("docs", record_id)
        assert state is not None
        (row,) = app.db.conn.execute("SELECT notes FROM docs WHERE id = ?", (record_id,)).fetchone()
        text = str(app.docs.richtext(record_id, "notes"))
        steps.append((str(state.fields["notes"]["s"]), bytes(row or b""), text))

    with create_app(SCHEMA, path=app_path) as app, create_app(SCHEMA, path=peer_path) as peer:
        record_id = app.docs.insert({"title": "d", "notes": "hello"})["id"]
        peer.apply(app.operations())
        mine, theirs = app.docs.richtext(record_id, "notes"), peer.docs.richtext(record_id, "notes")
        for i in range(12):
            mine.insert(len(mine), "abc"[i % 3])
            if i % 3 == 0:
                theirs.insert(0, "xyz"[i % 3])
                theirs.delete(2, 1)
                app.apply(peer.operations(after=app.version_vector))
            if i % 5 == 4:
                mine.delete(2, 2)
            snapshot(app, record_id)
        with pytest.raises(OfflineError):
            mine.insert(len(mine) + 5, "refused")
        mine.insert(0, ">")
        snapshot(app, record_id)
        app.rebuild()
        snapshot(app, record_id)
        mine.insert(len(mine), "<")
        snapshot(app, record_id)
    with create_app(SCHEMA, path=app_path) as app:
        handle = app.docs.richtext(record_id, "notes")
        handle.insert(1, "again")
        snapshot(app, record_id)
    return steps


def test_live_documents_store_what_fresh_documents_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documents kept between edits (`richtext._Documents`) change no stored byte nor any text: the same
    history run by the same two nodes with a cache that keeps nothing stores the same states."""
    for name in ("a", "b"):  # the same nodes twice (Yjs orders concurrent inserts by client, from the node)
        create_app(SCHEMA, path=str(tmp_path / f"{name}1.db")).close()
        shutil.copy(tmp_path / f"{name}1.db", tmp_path / f"{name}2.db")
    cached = _edits_with_remote_updates(str(tmp_path / "a1.db"), str(tmp_path / "b1.db"))
    monkeypatch.setattr(richtext, "_DOCUMENTS", richtext._Documents(size=0))
    fresh = _edits_with_remote_updates(str(tmp_path / "a2.db"), str(tmp_path / "b2.db"))
    assert cached[-1][2].startswith(">")
    assert cached == fresh


def test_an_edit_continues_in_the_document_the_previous_edit_left(app: App) -> None:
    """After a local edit, the folded state's kept document is the one the edit was made in (this node's
    Yjs client), so the next edit neither rebuilds it nor decodes the stored state."""
    record = app.docs.insert({"title": "d", "notes": "hello"})
    handle = app.docs.richtext(record["id"], "notes")
    handle.insert(5, "!")
    handle.insert(6, "?")
    state = app.cached_state("docs", record["id"])
    assert state is not None
    raw = richtext.decode_state(state.fields["notes"]["s"])
    assert raw is not None
    kept = richtext._DOCUMENTS.docs.get(raw)
    assert kept is not None and kept.client_id == richtext.client_id_for(app.node_id)
    assert kept.get_update() == raw and kept.text() == "hello!?"


def test_an_edit_after_a_read_loads_the_record_state_once(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the record's state is written out (a flush: a query, a sync, a batch of other writes), the next
    keystroke starts from the database: it reads the state (a document's size) once, to make its update
    and to fold it, not once for each."""
    record = app.docs.insert({"title": "d", "notes": "hello"})
    handle = app.docs.richtext(record["id"], "notes")
    handle.insert(5, " world")
    assert str(handle) == "hello world"
    app.flush()
    loads: list[tuple[str, str]] = []
    load_state = app.db.load_state

    def counted(collection: str, record_id: str) -> object:
        loads.append((collection, record_id))
        return load_state(collection, record_id)

    monkeypatch.setattr(app.db, "load_state", counted)
    handle.insert(11, "!")
    assert loads == [("docs", record["id"])]
    assert str(handle) == "hello world!"
    app.flush()
    handle.delete(0, 6)
    assert loads == [("docs", record["id"])] * 2
    assert app.docs.find_by_id(record["id"])["notes"] == "world!"
