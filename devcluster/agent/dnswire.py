"""Minimal DNS message encoding/decoding (RFC 1035): enough to answer A/AAAA questions (pure functions)."""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

TYPE_A = 1
TYPE_AAAA = 28
CLASS_IN = 1
RCODE_OK = 0
RCODE_FORMERR = 1
RCODE_SERVFAIL = 2
RCODE_NXDOMAIN = 3
RCODE_NOTIMP = 4
RCODE_REFUSED = 5


class DnsFormatError(ValueError):
    """The bytes are not a DNS query we can read."""


@dataclass(frozen=True)
class Question:
    name: str
    """Lower-case name without the trailing dot."""
    qtype: int
    qclass: int


@dataclass(frozen=True)
class Query:
    id: int
    flags: int
    questions: tuple[Question, ...]
    question_bytes: bytes
    """The question section as received, echoed in the answer."""


def _read_name(data: bytes, offset: int) -> tuple[str, int]:
    labels: list[str] = []
    jumped = False
    end = offset
    for _ in range(128):  # bounds pointer loops
        if offset >= len(data):
            raise DnsFormatError("name runs past the message")
        length = data[offset]
        if length == 0:
            if not jumped:
                end = offset + 1
            return ".".join(labels).lower(), end
        if length & 0xC0 == 0xC0:
            if offset + 1 >= len(data):
                raise DnsFormatError("truncated pointer")
            if not jumped:
                end = offset + 2
            offset = ((length & 0x3F) << 8) | data[offset + 1]
            jumped = True
            continue
        labels.append(data[offset + 1 : offset + 1 + length].decode("ascii", "replace"))
        offset += 1 + length
    raise DnsFormatError("name too long or pointer loop")


def decode_query(data: bytes) -> Query:
    if len(data) < 12:
        raise DnsFormatError("shorter than a DNS header")
    msg_id, flags, qdcount = struct.unpack("!HHH", data[:6])
    offset = 12
    questions = []
    for _ in range(qdcount):
        name, offset = _read_name(data, offset)
        if offset + 4 > len(data):
            raise DnsFormatError("truncated question")
        qtype, qclass = struct.unpack("!HH", data[offset : offset + 4])
        offset += 4
        questions.append(Question(name, qtype, qclass))
    return Query(msg_id, flags, tuple(questions), data[12:offset])


def encode_name(name: str) -> bytes:
    out = b""
    for label in name.strip(".").split("."):
        if label:
            raw = label.encode("ascii")
            out += bytes([len(raw)]) + raw
    return out + b"\x00"


def encode_query(msg_id: int, name: str, qtype: int = TYPE_A) -> bytes:
    """A recursive query for one name (used by tests and health checks)."""
    header = struct.pack("!HHHHHH", msg_id, 0x0100, 1, 0, 0, 0)
    return header + encode_name(name) + struct.pack("!HH", qtype, CLASS_IN)


def encode_response(query: Query, rcode: int, addresses: list[str], ttl: int = 5) -> bytes:
    """An authoritative answer to the query's first question, with A (or AAAA) records for `addresses`."""
    opcode_rd = query.flags & 0x7900  # opcode + RD
    flags = 0x8000 | 0x0400 | opcode_rd | 0x0080 | (rcode & 0xF)  # QR, AA, opcode/RD, RA, rcode
    answers = b""
    count = 0
    if query.questions:
        for address in addresses:
            packed = ipaddress.ip_address(address).packed
            rtype = TYPE_A if len(packed) == 4 else TYPE_AAAA
            # 0xC00C: pointer to the first question's name, right after the header
            answers += struct.pack("!HHHIH", 0xC00C, rtype, CLASS_IN, ttl, len(packed)) + packed
            count += 1
    header = struct.pack("!HHHHHH", query.id, flags, len(query.questions), count, 0, 0)
    return header + query.question_bytes + answers


def decode_response(data: bytes) -> tuple[int, list[str]]:
    """(rcode, addresses of A/AAAA answers) of a response (used by tests and health checks)."""
    _, flags, qdcount, ancount = struct.unpack("!HHHH", data[:8])
    offset = 12
    for _ in range(qdcount):
        _, offset = _read_name(data, offset)
        offset += 4
    addresses = []
    for _ in range(ancount):
        _, offset = _read_name(data, offset)
        rtype, _, _, length = struct.unpack("!HHIH", data[offset : offset + 10])
        offset += 10
        if rtype in (TYPE_A, TYPE_AAAA):
            addresses.append(str(ipaddress.ip_address(data[offset : offset + length])))
        offset += length
    return flags & 0xF, addresses
