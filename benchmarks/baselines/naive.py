#!/usr/bin/env python3
"""The script a user writes first: stdlib only, sequential, no cleverness.

Read the CSV manifest; for every 1,000 rows create a task (POST) the first time and append to
it (PUT) afterwards, starting a new task if the open one has expired; then poll each task's
status once a second until it is done, read its results one 100-result page at a time with
``json``, and write one JSONL line per result. No retries, no concurrency.

    python benchmarks/baselines/naive.py MANIFEST.csv --base-url URL --out results.jsonl

Keys come from FASHIONTAG_BULK_API_KEY (or FASHIONTAG_API_KEY), else the development key the
reference service accepts out of the box.
"""

import argparse
import csv
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

BULK_PATH = "/tagger/v2.12/bulk"
CHUNK = 1000
PAGE = 100
DEV_BULK_API_KEY = "dev-bulk-api-key"  # fashiontag_pipeline._config.DEV_BULK_API_KEY


def call(method: str, url: str, key: str, body: object = None) -> Any:
    data = json.dumps(body).encode("utf-8") if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("x-api-key", key)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def main() -> None:
    parser = argparse.ArgumentParser(description="naive sequential bulk tagging")
    parser.add_argument("manifest")
    parser.add_argument("--base-url", default=os.environ.get("FASHIONTAG_BASE_URL"))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    base = (args.base_url or "http://127.0.0.1:8080").rstrip("/")
    key = (
        os.environ.get("FASHIONTAG_BULK_API_KEY")
        or os.environ.get("FASHIONTAG_API_KEY")
        or DEV_BULK_API_KEY
    )

    tasks: list[str] = []
    task_id: str | None = None

    def send(rows: list[dict[str, str]]) -> None:
        nonlocal task_id
        body = {
            "description": "naive baseline",
            "taggingRequest": [
                {"image": {"type": "url", "content": row["url"]}, "context": {"id": row["id"]}}
                for row in rows
            ],
        }
        if task_id is not None:
            try:
                call("PUT", f"{base}{BULK_PATH}/{task_id}", key, body)
                return
            except urllib.error.HTTPError as err:
                if err.code != 410:  # expired: fall through and start a new task
                    raise
        created = call("POST", base + BULK_PATH, key, body)
        task_id = created["taskId"]
        tasks.append(task_id)

    with open(args.manifest, newline="", encoding="utf-8") as fh:
        batch: list[dict[str, str]] = []
        for row in csv.DictReader(fh):
            batch.append(row)
            if len(batch) == CHUNK:
                send(batch)
                batch = []
        if batch:
            send(batch)

    written = 0
    with open(args.out, "w", encoding="utf-8") as out:
        for tid in tasks:
            while True:
                task = call("GET", f"{base}{BULK_PATH}/{tid}/status", key)["data"]
                if task["taskStatus"] == "TASK_DONE":
                    break
                time.sleep(1)
            total = task["count"]["total"]
            offset = 0
            while offset < total:
                page = call("GET", f"{base}{BULK_PATH}/{tid}?offset={offset}&size={PAGE}", key)
                for result in page["data"]["results"]:
                    line = {
                        "id": result["id"],
                        "taskId": tid,
                        "taggingResult": result["taggingResult"],
                    }
                    out.write(json.dumps(line) + "\n")
                    written += 1
                offset += PAGE
    print(f"naive: {written} results from {len(tasks)} task(s)", file=sys.stderr)


if __name__ == "__main__":
    main()
