"""LineSplitter: the lines of a stream fed in pieces, and what happens to a line too long for
any record: it is refused and never stored in part (what was fed of it goes, what follows of it
up to its newline is refused or dropped)."""

from __future__ import annotations

import pytest

from seglogfs.engine.errors import RecordTooLargeError
from seglogfs.engine.producer import LineSplitter


class Sink:
    """`consume` for a splitter: keeps the lines it is given; refuses lines longer than `most`
    as the producer does (RecordTooLargeError), storing none of the piece's lines then."""

    def __init__(self, most: int = 10**9) -> None:
        self.most = most
        self.lines: list[bytes] = []

    def __call__(self, lines: list[bytes]) -> int:
        if any(len(line) > self.most for line in lines):
            raise RecordTooLargeError("a record over max.message.bytes")
        self.lines += lines
        return len(lines)


def fed(splitter: LineSplitter, sink: Sink, *pieces: bytes) -> list[str]:
    """Feed the pieces one by one, then finish; what each piece did ("ok" or "refused")."""
    said = []
    for piece in pieces:
        try:
            splitter.feed(piece, sink)
        except RecordTooLargeError:
            said.append("refused")
        else:
            said.append("ok")
    sink(splitter.finish())
    return said


def test_lines_across_pieces() -> None:
    sink = Sink()
    assert fed(LineSplitter(100, "t/0/append"), sink, b"a", b"b\nc", b"d\n\ne", b"f") == ["ok"] * 4
    assert sink.lines == [b"ab", b"cd", b"", b"ef"]


def test_a_partial_line_grown_past_the_limit_is_never_stored_in_part() -> None:
    """Pieces of one line, the third making it too long: refused, and neither what came before
    nor the rest up to its newline is stored; the lines after it are."""
    sink = Sink()
    said = fed(LineSplitter(10, "t/0/append"), sink, b"ok\n12345", b"6789", b"abc", b"def", b"gh\nnext\n")
    assert said == ["ok", "ok", "refused", "refused", "ok"]
    assert sink.lines == [b"ok", b"next"]


def test_a_line_refused_then_the_stream_closed_leaves_nothing_of_it() -> None:
    sink = Sink()
    assert fed(LineSplitter(10, "t/0/append"), sink, b"12345678", b"90abc") == ["ok", "refused"]
    assert sink.lines == []


def test_a_piece_ending_a_partial_line_too_long_for_a_record_takes_it_with_it() -> None:
    """The line fits the splitter's limit in each piece, but the record it makes does not (the
    producer refuses it): the piece fails whole, and the partial line it ended is not stored at
    the end as a line of its own."""
    sink = Sink(most=8)
    assert fed(LineSplitter(10, "t/0/append"), sink, b"123456", b"789\n") == ["ok", "refused"]
    assert sink.lines == []


def test_a_piece_that_fails_for_another_reason_leaves_the_partial_line() -> None:
    """A piece refused for something a retry may mend (a full disk) takes nothing with it: the
    same piece again ends the line."""
    splitter, lines, full = LineSplitter(100, "t/0/append"), [], [True]

    def full_then_room(piece: list[bytes]) -> None:
        if piece and full.pop():
            raise OSError(28, "No space left on device")
        lines.extend(piece)

    splitter.feed(b"abc", full_then_room)
    with pytest.raises(OSError):
        splitter.feed(b"def\n", full_then_room)
    full.append(False)
    splitter.feed(b"def\n", full_then_room)
    assert lines == [b"abcdef"]


@pytest.mark.parametrize("tail", [b"", b"x\n"])
def test_the_refusal_names_where_and_the_limit(tail: bytes) -> None:
    splitter = LineSplitter(4, "t/0/append")
    with pytest.raises(RecordTooLargeError, match=r"t/0/append: a line of more than 4 bytes"):
        splitter.feed(tail + b"12345", Sink())
    with pytest.raises(RecordTooLargeError, match=r"t/0/append: the rest of a line .* refused before"):
        splitter.feed(b"6", Sink())
