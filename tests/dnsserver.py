"""A tiny authoritative DNS responder on loopback UDP (dnspython builds the answers), for
DNS discovery tests: A/AAAA and SRV records the test sets, NXDOMAIN for the rest, and a
``silent`` switch that stops answering (a resolver outage)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset


class DnsResponder:
    def __init__(self) -> None:
        self.records: dict[tuple[str, str], list[str]] = {}  # (name., type) -> rdata texts
        self.glue = True  # send SRV targets' A records in the additional section
        self.silent = False
        self.queries: list[tuple[str, str]] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.address = self._sock.getsockname()
        self._stop = threading.Event()

    def set(self, name: str, rdtype: str, values: list[str]) -> None:
        self.records[(name.rstrip(".") + ".", rdtype)] = values

    def _answer(self, wire: bytes) -> bytes | None:
        query = dns.message.from_wire(wire)
        question = query.question[0]
        name, rdtype = question.name.to_text(), dns.rdatatype.to_text(question.rdtype)
        self.queries.append((name, rdtype))
        if self.silent:
            return None
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        values = self.records.get((name, rdtype))
        if values is None and not any(n == name for n, _ in self.records):
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif values:
            response.answer.append(dns.rrset.from_text_list(name, 30, "IN", rdtype, values))
            if rdtype == "SRV" and self.glue:
                for value in values:
                    target = value.split()[-1]
                    for kind in ("A", "AAAA"):
                        if (target, kind) in self.records:
                            response.additional.append(dns.rrset.from_text_list(target, 30, "IN", kind, self.records[(target, kind)]))
        return response.to_wire()

    def serve(self) -> None:
        while not self._stop.is_set():
            try:
                wire, peer = self._sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            answer = self._answer(wire)
            if answer is not None:
                self._sock.sendto(answer, peer)

    def close(self) -> None:
        self._stop.set()


@contextmanager
def dns_responder() -> Iterator[DnsResponder]:
    responder = DnsResponder()
    thread = threading.Thread(target=responder.serve, daemon=True)
    thread.start()
    try:
        yield responder
    finally:
        responder.close()
        thread.join(timeout=5)
        responder._sock.close()
