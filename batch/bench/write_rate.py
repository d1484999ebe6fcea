"""How many finished requests per second one DuckDB writer takes: the ceiling of a Ray driver.

A Ray run's driver writes every worker's results through the store's one writer, so
N workers can be fed as long as together they finish fewer requests per second than
this. It replays the rows of a stored run (requests, responses, events) through
`Store.write_results` in batches, into a scratch database:

    python -m batch.bench.write_rate RUN.duckdb [--run RUN_ID] [--repeats 20] [--batch 16]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from batch.responses.events import EventColumns
from batch.responses.standard_json import json_text
from batch.responses.status import RequestStatus, ResponseStatus
from batch.store.rows import RequestResult, RequestRow, ResponseRow
from batch.store.store import Store


def stored_results(store: Store, run_id: str) -> list[RequestResult]:
    """The requests, responses and events of a stored run as results the writer takes."""
    results = []
    for row in store.responses.iter_lines(run_id):
        request = RequestRow(run_id=run_id, custom_id=row["custom_id"], line_no=row["line_no"],
                             status=RequestStatus(row["status"]), error=row["error"], response_id=row["response_id"])
        response, events = None, None
        if row["response"] is not None:
            usage = row["response"].get("usage") or {}
            response = ResponseRow(run_id=run_id, custom_id=row["custom_id"], response_id=row["response_id"],
                                   status=ResponseStatus(row["response"]["status"]), response=row["response"],
                                   input_tokens=usage.get("input_tokens", 0),
                                   output_tokens=usage.get("output_tokens", 0))
            events = EventColumns()
            for event in store.responses.events(row["response_id"]):
                for name in ("sequence_number", "type", "output_index", "content_index", "item_id",
                             "turn", "t_ms"):
                    getattr(events, name).append(event[name])
                events.payload.append(json_text(event["payload"]))
        results.append(RequestResult(request, response, events))
    return results


def _copy(result: RequestResult, run_id: str, suffix: str) -> RequestResult:
    response_id = f"{result.request.response_id}_{suffix}"
    if result.response is None:
        return RequestResult(replace(result.request, run_id=run_id, response_id=None))
    return RequestResult(replace(result.request, run_id=run_id, response_id=response_id),
                         replace(result.response, run_id=run_id, response_id=response_id), result.events)


def measure(source: Path, run_id: str | None, repeats: int, batch: int) -> dict:
    """Write the run `repeats` times in batches of `batch`; returns requests/s and events/s."""
    with Store(source, read_only=True) as store:
        run_id = run_id or store.runs.list()[0].run.run_id
        results = stored_results(store, run_id)
    num_events = sum(len(r.events) for r in results if r.events is not None)
    with tempfile.TemporaryDirectory() as scratch, Store(Path(scratch) / "rate.duckdb") as target:
        elapsed = 0.0
        for repeat in range(repeats):
            copies = [_copy(result, f"rate_{repeat}", str(repeat)) for result in results]
            start = time.perf_counter()
            for first in range(0, len(copies), batch):
                target.write_results(copies[first:first + batch], replace_lines=False)
            elapsed += time.perf_counter() - start
    written = repeats * len(results)
    return {"requests": written, "events": repeats * num_events, "seconds": elapsed,
            "requests_per_s": written / elapsed, "events_per_s": repeats * num_events / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path)
    parser.add_argument("--run", default=None)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    rate = measure(args.db, args.run, args.repeats, args.batch)
    print(f"{rate['requests']} requests ({rate['events']} events) in {rate['seconds']:.2f}s: "
          f"{rate['requests_per_s']:,.0f} requests/s, {rate['events_per_s']:,.0f} events/s")


if __name__ == "__main__":
    main()
