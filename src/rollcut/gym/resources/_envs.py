"""The environments rollcut ships, each real and each declaring how it checkpoints."""

from __future__ import annotations

import asyncio
import json
import random
import re
import sqlite3
from typing import Any, ClassVar

import msgspec

from ...participants import CheckpointMode
from ._env import Environment, ToolResult


def _blackjack() -> Any:
    """A fresh Blackjack-v1. gymnasium (and numpy under it) is imported here, by the one
    environment that uses it, not by every server that lists the environments."""
    import gymnasium

    return gymnasium.make("Blackjack-v1").unwrapped


__all__ = [
    "Blackjack",
    "Counter",
    "Judge",
    "Letters",
    "MathVerifier",
    "Scratchpad",
    "Workplace",
    "WorkplaceExported",
]


class Counter(Environment):
    """The smallest stateful example: its state is the fold of its deltas."""

    name = "counter"

    @classmethod
    def demo_task(cls, rng: random.Random) -> dict[str, Any]:
        start = rng.randint(0, 9)
        return {
            "prompt": f"Starting at {start}, add numbers, then report the total.",
            "seed": {"start": start},
        }

    mode: ClassVar[CheckpointMode] = "event_sourced"

    def tools(self) -> dict[str, Any]:
        return {"add": self._add, "read": self._read}

    def parameters(self) -> dict[str, dict[str, Any]]:
        return {"add": {"n": {"type": "integer"}}}

    def seed(self, args: dict[str, Any]) -> dict[str, int]:
        return {"value": int(args.get("start", 0))}

    def _add(self, state: dict[str, int], args: dict[str, Any]) -> ToolResult:
        n = int(args.get("n", 1))
        state["value"] += n
        return {"value": state["value"]}, n

    def _read(self, state: dict[str, int], args: dict[str, Any]) -> ToolResult:
        return {"value": state["value"]}, 0

    def apply_delta(self, state: Any, tool: str, arguments: Any, delta: Any) -> Any:
        state["value"] += int(delta)
        return state

    def verify(self, state: dict[str, int], args: dict[str, Any]) -> dict[str, Any]:
        target = args.get("target")
        passed = target is None or state["value"] == int(target)
        return {"reward": 1.0 if passed else 0.0, "passed": passed, "value": state["value"]}

    def export_state(self, state: Any) -> bytes:
        return msgspec.msgpack.encode(state)

    def import_state(self, blob: bytes, codec_version: int) -> Any:
        return msgspec.msgpack.decode(blob)


class Blackjack(Environment):
    """gymnasium's Blackjack-v1; the state includes the deck's random generator,
    so a restored game deals exactly the cards the uninterrupted game would have."""

    name = "blackjack"

    @classmethod
    def demo_task(cls, rng: random.Random) -> dict[str, Any]:
        seed = {"seed": rng.randint(0, 10_000)}
        return {"prompt": "Play one hand of blackjack and try to win.", "seed": seed}

    mode: ClassVar[CheckpointMode] = "event_sourced"
    state_in_events = True

    def tools(self) -> dict[str, Any]:
        return {"hit": self._hit, "stand": self._stand, "look": self._look}

    def seed(self, args: dict[str, Any]) -> Any:
        env = _blackjack()
        env.reset(seed=int(args.get("seed", 0)))
        return {"env": env, "done": False, "reward": 0.0}

    def _obs(self, state: Any) -> dict[str, Any]:
        env = state["env"]
        return {
            "player": list(env.player),
            "dealer_showing": env.dealer[0],
            "done": state["done"],
            "reward": state["reward"],
        }

    def _step(self, state: Any, action: int) -> ToolResult:
        if state["done"]:
            return {**self._obs(state), "error": "the game is over"}, None
        _, reward, terminated, truncated, _ = state["env"].step(action)
        state["done"], state["reward"] = bool(terminated or truncated), float(reward)
        out = self._obs(state)
        if state["done"]:
            out["dealer"] = list(state["env"].dealer)
        return out, None

    def _hit(self, state: Any, args: dict[str, Any]) -> ToolResult:
        return self._step(state, 1)

    def _stand(self, state: Any, args: dict[str, Any]) -> ToolResult:
        return self._step(state, 0)

    def _look(self, state: Any, args: dict[str, Any]) -> ToolResult:
        return self._obs(state), None

    def verify(self, state: Any, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "reward": state["reward"],
            "passed": state["done"] and state["reward"] > 0,
            "player": list(state["env"].player),
            "dealer": list(state["env"].dealer),
        }

    def export_state(self, state: Any) -> bytes:
        env = state["env"]
        snapshot = {
            "player": list(env.player),
            "dealer": list(env.dealer),
            "rng": env.np_random.bit_generator.state,
            "done": state["done"],
            "reward": state["reward"],
        }
        # JSON, not msgpack: the PCG64 generator's state holds 128-bit integers
        return json.dumps(snapshot, sort_keys=True).encode()

    def import_state(self, blob: bytes, codec_version: int) -> Any:
        d = json.loads(blob)
        env: Any = _blackjack()
        env.reset(seed=0)
        env.player, env.dealer = list(d["player"]), list(d["dealer"])
        env.np_random.bit_generator.state = d["rng"]
        return {"env": env, "done": d["done"], "reward": d["reward"]}


_SCHEMA = """
create table email(id integer primary key, recipient text, subject text, body text);
create table calendar(id integer primary key, title text, day text, attendees text);
create table crm(id integer primary key, name text, company text, stage text);
"""


class Workplace(Environment):
    """Email, calendar and CRM tools over one SQLite database per session.

    The codec is ``sqlite3.Connection.serialize``/``deserialize``: restored row
    for row. This variant logs the (small) database with every mutation, so a
    session survives the loss of its process at any point;
    :class:`WorkplaceExported` logs only the calls and snapshots at prepare.
    """

    name = "workplace"

    @classmethod
    def demo_task(cls, rng: random.Random) -> dict[str, Any]:
        who = rng.choice(_NAMES)
        return {
            "prompt": f"Email {who}, book a meeting, and mark {who} as won.",
            "seed": {"contacts": [{"name": who, "company": "Acme"}]},
            "verify": {"expect": {"crm": [{"name": who}]}},
        }

    mode: ClassVar[CheckpointMode] = "event_sourced"
    state_in_events = True

    def tools(self) -> dict[str, Any]:
        return {
            "send_email": self._send_email,
            "create_event": self._create_event,
            "add_contact": self._add_contact,
            "update_stage": self._update_stage,
            "query": self._query,
        }

    def parameters(self) -> dict[str, dict[str, Any]]:
        s = {"type": "string"}
        return {
            "send_email": {"to": s, "subject": s, "body": s},
            "create_event": {"title": s, "day": s},
            "add_contact": {"name": s, "company": s},
            "update_stage": {"name": s, "stage": s},
            "query": {"table": {"type": "string", "enum": ["email", "calendar", "crm"]}},
        }

    def seed(self, args: dict[str, Any]) -> sqlite3.Connection:
        db = sqlite3.connect(":memory:", check_same_thread=False)
        db.executescript(_SCHEMA)
        for c in args.get("contacts", []):
            db.execute(
                "insert into crm(name, company, stage) values (?, ?, ?)",
                (c["name"], c.get("company", ""), c.get("stage", "lead")),
            )
        db.commit()
        return db

    @staticmethod
    def _insert(db: sqlite3.Connection, sql: str, values: tuple[Any, ...]) -> int | None:
        """One row in, committed: its id."""
        cur = db.execute(sql, values)
        db.commit()
        return cur.lastrowid

    def _send_email(self, db: sqlite3.Connection, a: dict[str, Any]) -> ToolResult:
        sql = "insert into email(recipient, subject, body) values (?, ?, ?)"
        return {"email_id": self._insert(db, sql, (a["to"], a.get("subject", ""), a.get("body", "")))}, None

    def _create_event(self, db: sqlite3.Connection, a: dict[str, Any]) -> ToolResult:
        sql = "insert into calendar(title, day, attendees) values (?, ?, ?)"
        values = (a["title"], a["day"], ",".join(a.get("attendees", [])))
        return {"event_id": self._insert(db, sql, values)}, None

    def _add_contact(self, db: sqlite3.Connection, a: dict[str, Any]) -> ToolResult:
        sql = "insert into crm(name, company, stage) values (?, ?, ?)"
        values = (a["name"], a.get("company", ""), a.get("stage", "lead"))
        return {"contact_id": self._insert(db, sql, values)}, None

    def _update_stage(self, db: sqlite3.Connection, a: dict[str, Any]) -> ToolResult:
        n = db.execute("update crm set stage = ? where name = ?", (a["stage"], a["name"])).rowcount
        db.commit()
        return {"updated": n}, None

    def _query(self, db: sqlite3.Connection, a: dict[str, Any]) -> ToolResult:
        table = a.get("table", "crm")
        if table not in ("email", "calendar", "crm"):
            return {"error": f"no table {table}"}, None
        return {"rows": [list(r) for r in db.execute(f"select * from {table} order by id")]}, None

    def rows(self, db: sqlite3.Connection) -> dict[str, list[list[Any]]]:
        return {
            t: [list(r) for r in db.execute(f"select * from {t} order by id")]
            for t in ("email", "calendar", "crm")
        }

    def verify(self, db: sqlite3.Connection, args: dict[str, Any]) -> dict[str, Any]:
        """The task's expectation: rows that must exist, by table."""
        rows = self.rows(db)
        missing = []
        for table, wanted in (args.get("expect") or {}).items():
            have = [dict(zip(self._cols(db, table), r, strict=True)) for r in rows.get(table, [])]
            for w in wanted:
                if not any(all(h.get(k) == v for k, v in w.items()) for h in have):
                    missing.append({table: w})
        return {"reward": 0.0 if missing else 1.0, "passed": not missing, "missing": missing}

    def _cols(self, db: sqlite3.Connection, table: str) -> list[str]:
        return [c[1] for c in db.execute(f"pragma table_info({table})")]

    def export_state(self, db: sqlite3.Connection) -> bytes:
        return bytes(db.serialize())

    def import_state(self, blob: bytes, codec_version: int) -> sqlite3.Connection:
        db = sqlite3.connect(":memory:", check_same_thread=False)
        db.deserialize(blob)
        return db

    def copy(self, state: Any) -> Any:
        return self.import_state(self.export_state(state), self.codec_version)

    def close(self, state: Any) -> None:
        state.close()


class WorkplaceExported(Workplace):
    """The same tools, checkpointed by export: mutations log only what the agent
    did, and each session's database is snapshotted at an aligned prepare.
    Cheaper per call; the state since the last snapshot dies with the process,
    so such a session continues only from a checkpoint taken while it was alive
    (otherwise its rollout is freshly dispatched)."""

    name = "workplace_exported"
    mode: ClassVar[CheckpointMode] = "exported"
    state_in_events = False


class MathVerifier(Environment):
    """Stateless; verification is replayable: re-running it gives the same answer."""

    name = "math"

    @classmethod
    def demo_task(cls, rng: random.Random) -> dict[str, Any]:
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        return {"prompt": f"What is {a} + {b}?", "seed": {}, "verify": {"expected": str(a + b)}}

    mode: ClassVar[CheckpointMode] = "stateless"

    def verify(self, state: Any, args: dict[str, Any]) -> dict[str, Any]:
        expected = str(args.get("expected", "")).strip()
        numbers = re.findall(r"-?\d+(?:\.\d+)?", str(args.get("answer", "")))
        got = numbers[-1] if numbers else ""
        passed = got == expected
        return {"reward": 1.0 if passed else 0.0, "passed": passed, "parsed": got}


class Letters(Environment):
    """A dense reward for a policy that starts from noise: the share of the answer's characters that
    are among ``chars``. GRPO learns only from rewards that differ within a group, and a tiny random
    policy never gets a sum right; it does write some letters more often than others."""

    name = "letters"

    @classmethod
    def demo_task(cls, rng: random.Random) -> dict[str, Any]:
        return {"prompt": "Write the letter e, many times.", "seed": {}, "verify": {"chars": "e"}}

    mode: ClassVar[CheckpointMode] = "stateless"

    def verify(self, state: Any, args: dict[str, Any]) -> dict[str, Any]:
        chars, answer = args.get("chars", ""), str(args.get("answer", ""))
        if not isinstance(chars, str) or not 0 < len(chars) <= 64:
            raise ValueError("verify.chars: a string of 1 to 64 characters")
        share = sum(c in chars for c in answer) / len(answer) if answer else 0.0
        return {"reward": share, "passed": share >= 0.5, "share": share}


class Judge(Environment):
    """A slow verifier, as an LLM judge is: stateless, and its verification declares ``wait``.

    Re-running a judge need not give the same verdict (it samples), so a
    checkpoint must not cut one in flight and replay it: prepare waits for the
    verifications running (and admits no new ones until the checkpoint ends).
    The verdict: the share of ``expect_words`` the answer contains.
    ``judge_delay_s`` (at most 10) is how long judging takes.
    """

    name = "judge"

    @classmethod
    def demo_task(cls, rng: random.Random) -> dict[str, Any]:
        return {
            "prompt": "Explain in one sentence why the sky is blue.",
            "seed": {},
            "verify": {"expect_words": ["light", "scatter"], "judge_delay_s": 0.05},
        }

    mode: ClassVar[CheckpointMode] = "stateless"
    verification: ClassVar[str] = "wait"

    async def verify(self, state: Any, args: dict[str, Any]) -> dict[str, Any]:
        delay = args.get("judge_delay_s", 0)
        await asyncio.sleep(min(max(float(delay), 0.0), 10.0) if isinstance(delay, int | float) else 0.0)
        words = [str(w).lower() for w in args.get("expect_words") or [] if isinstance(w, str)]
        answer = str(args.get("answer", "")).lower()
        matched = sum(w in answer for w in words)
        reward = matched / len(words) if words else 1.0
        return {"reward": reward, "passed": reward == 1.0, "matched": matched}


class Scratchpad(Environment):
    """Declares nothing: restart_only. Continuing it would be a false guarantee."""

    name = "scratchpad"

    @classmethod
    def demo_task(cls, rng: random.Random) -> dict[str, Any]:
        return {"prompt": "Write down three ideas for a name.", "seed": {}}

    def tools(self) -> dict[str, Any]:
        return {"write": self._write}

    def seed(self, args: dict[str, Any]) -> list[str]:
        return []

    def _write(self, state: list[str], args: dict[str, Any]) -> ToolResult:
        state.append(str(args.get("text", "")))
        return {"lines": len(state)}, None

    def copy(self, state: Any) -> Any:
        return list(state)


_NAMES = ["Ada", "Grace", "Linus", "Barbara", "Ken", "Margaret"]
