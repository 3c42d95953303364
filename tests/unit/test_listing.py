"""Job listings on the wire (server/listing.py): squeue's columns as rows, each array's pending
tasks merged by the server as squeue would, gzip for the clients that ask, and the client's
side of each (shoal.api_client, shoal.slurm.squeue)."""

from __future__ import annotations

import gzip
import json

import pytest

from shoal import api_client
from shoal.server import listing
from shoal.server.jobs import queue_view
from shoal.slurm import squeue
from tests.unit.test_cli_render import NOW, QUEUE, job

VIEW_KEYS = [k for k in listing.ROW_COLUMNS if k != "array_tasks"]


def view(j: dict) -> dict:
    """A Job as the queue view holds it: only squeue's default columns."""
    return {k: j[k] for k in VIEW_KEYS}


# Two arrays' pending tasks with different reasons, a lone pending task of a third, a running
# task among the first's, a requeued task still completing, plain jobs.
QUEUED = [view(j) for j in QUEUE] + [view(j) for j in (
    job(job_id=40 + t, array_job_id=40, array_task_id=t, name="other", reason="Priority" if t % 2 else "Resources")
    for t in range(5))] + [
    view(job(job_id=50, array_job_id=50, array_task_id=7, name="lone")),
    view(job(job_id=51, array_job_id=40, array_task_id=9, name="other", completing=True)),
    view(job(job_id=52, array_job_id=40, array_task_id=10, name="other", partition="debug")),
]
QUEUED.sort(key=lambda j: j["job_id"])


def rows_answer(jobs: list[dict]) -> dict:
    return json.loads(listing.encode(jobs, "rows"))


def test_the_rows_form_lists_the_columns_once_and_decodes_to_the_same_jobs():
    answer = rows_answer(QUEUED)
    assert answer["columns"] == list(listing.ROW_COLUMNS)
    assert all(isinstance(r, list) and len(r) == len(listing.ROW_COLUMNS) for r in answer["rows"])
    assert squeue.listed_jobs(answer) == [{**j, "array_tasks": None} for j in QUEUED]
    assert len(listing.encode(QUEUED, "rows")) < len(listing.encode(QUEUED, "jobs")) / 2
    assert squeue.listed_jobs(json.loads(listing.encode(QUEUED, "jobs"))) == QUEUED


def packed_answer(jobs: list[dict]) -> dict:
    return json.loads(listing.encode(jobs, "packed"))


@pytest.mark.parametrize("jobs", [QUEUED, listing.collapse(QUEUED), QUEUED[:1], []])
def test_the_packed_form_writes_shared_values_once_and_decodes_to_what_rows_do(jobs):
    answer = packed_answer(jobs)
    assert squeue.listed_jobs(answer) == squeue.listed_jobs(rows_answer(jobs))
    assert [row[0] for row in answer["rows"]] == [j["job_id"] for j in jobs]
    assert sorted([*answer["columns"], *answer["shared_columns"]]) == sorted(listing.ROW_COLUMNS)
    shared = [tuple(v) for v in answer["shared"]]
    assert len(set(shared)) == len(shared)  # each combination once
    assert sorted({row[-1] for row in answer["rows"]}) == list(range(len(shared)))  # each one used


def test_the_packed_form_of_many_jobs_like_each_other_is_much_smaller_than_rows():
    many = [{**QUEUED[0], "job_id": i, "state": "PENDING", "reason": "Priority", "nodelist": ""}
            for i in range(1000, 3000)]
    assert len(listing.encode(many, "packed")) < len(listing.encode(many, "rows")) / 3
    assert len(packed_answer(many)["shared"]) == 1


def test_the_rows_columns_are_what_the_queue_view_makes():
    """A column the view gains must reach the rows (the view's dicts and the columns agree)."""
    made = queue_view(None, [tuple(None if k == "allocation" else 1 for k in listing.jobsvc.QUEUE_VIEW)], set())
    assert list(made[0]) + ["array_tasks"] == list(listing.ROW_COLUMNS)


@pytest.mark.parametrize("args", [[], ["-h"], ["-u", "alice"], ["-p", "gpu,debug"], ["-n", "other,sweep"],
                                  ["-j", "40"], ["--me"]])
def test_squeue_prints_the_same_from_the_servers_collapsed_rows_as_from_every_task(args):
    options = squeue.parse_args(args, user="alice")
    params = squeue.query(options)
    assert params["form"] == "packed" and params["collapse"] == "true"
    merged = squeue.listed_jobs(packed_answer(listing.collapse(QUEUED)))
    assert len(merged) < len(QUEUED)
    out = squeue.render_jobs(merged, options, NOW)
    assert out == squeue.render_jobs(QUEUED, options, NOW)
    assert "40_[0-4,9]" in out and " 40_10 " in out


@pytest.mark.parametrize("args", [["-r"], ["-t", "CG"], ["-t", "pd"], ["--states=all"]])
def test_squeue_asks_for_every_task_where_its_own_filters_or_options_need_them(args):
    """-r lists each task; -t may split an array's pending tasks (CG among PD): not merged."""
    params = squeue.query(squeue.parse_args(args))
    assert params.get("collapse") is None and params["form"] == "packed"


def test_squeue_asks_a_server_older_than_the_packed_form_for_plain_rows():
    """A server from before form=packed refuses it (400, as its check_form words it); squeue
    asks again for rows, and keeps asking for rows (--iterate)."""
    asked = []

    class OldServer:
        def get(self, path: str, params: dict) -> dict:
            asked.append(params["form"])
            if params["form"] not in ("jobs", "rows"):
                raise api_client.ClientError(f"unknown form {params['form']!r} (expected one of jobs, rows)", 400)
            return rows_answer(QUEUED)

    params = squeue.query(squeue.parse_args([]))
    wanted = squeue.listed_jobs(rows_answer(QUEUED))
    assert squeue.fetch(OldServer(), params) == squeue.fetch(OldServer(), params) == wanted
    assert asked == ["packed", "rows", "rows"]

    class Refusing:
        def get(self, path: str, params: dict) -> dict:
            raise api_client.ClientError("invalid token", 401)

    with pytest.raises(api_client.ClientError, match="invalid token"):
        squeue.fetch(Refusing(), squeue.query(squeue.parse_args([])))


def test_squeue_with_a_format_asks_for_whole_jobs():
    params = squeue.query(squeue.parse_args(["-o", "%i %j"]))
    assert "form" not in params and "collapse" not in params and "view" not in params


@pytest.mark.parametrize("header, ok", [
    (None, False), ("", False), ("identity", False), ("gzip", True), ("br, gzip;q=0.5", True),
    ("GZIP", True), ("x-gzip", True), ("gzip;q=0", False), ("*", True), ("*;q=0", False),
    ("gzip;q=0, *", False), ("deflate, br", False), ("gzip;q=bad", False),
])
def test_gzip_is_sent_only_to_clients_whose_accept_encoding_admits_it(header, ok):
    assert listing.accepts_gzip(header) is ok


def test_gzip_answers_decompress_to_the_plain_answer():
    body = listing.encode(QUEUED, "rows")
    assert gzip.decompress(listing.gzipped(body)) == body


def answer(body: bytes, *headers: str) -> bytes:
    return b"\r\n".join([b"HTTP/1.1 200 OK", *(h.encode() for h in headers),
                         f"Content-Length: {len(body)}".encode(), b"", body])


def test_the_client_asks_for_gzip_and_decodes_a_gzipped_answer():
    c = api_client.Client("http://127.0.0.1:1", "t")
    assert b"\r\nAccept-Encoding: gzip\r\n" in c._message("GET", "/shoal/v1/jobs", None, gzip=True)
    assert b"Accept-Encoding" not in c._message("GET", "/shoal/v1/jobs", None)  # streams: never
    plain = listing.encode(QUEUED, "rows")
    assert api_client._parse_response(answer(gzip.compress(plain), "Content-Encoding: gzip")) == (200, plain)
    assert api_client._parse_response(answer(plain)) == (200, plain)
    with pytest.raises(api_client.ClientError, match="malformed gzipped"):
        api_client._parse_response(answer(b"not gzip", "Content-Encoding: gzip"))


@pytest.mark.parametrize("args", [[], ["-N"], ["-l"], ["-N", "-l"], ["-s"], ["-R"], ["-R", "-l"], ["-e"], ["-d"],
                                  ["-o", "%all"], ["-t", "idle", "-p", "debug"], ["--json"]])
def test_sinfo_prints_the_same_from_its_view_of_the_nodes_as_from_whole_nodes(args):
    """sinfo asks for ``GET /nodes?view=sinfo``: no key it reads may be left out of the view."""
    from shoal.cli import sinfo
    from shoal.server.nodelist import SINFO_VIEW
    from tests.unit.test_cli_render import NODES, PARTS

    nodes = [{**n, "labels": {"nvidia.com/gpu.count": "8"}, "images": ["x"], "last_heartbeat": NOW - 3,
              "reason_time": NOW - 60 if n["reason"] else None, "taints": [], "gpu_health": []} for n in NODES]
    seen = [{k: n[k] for k in SINFO_VIEW if k in n} for n in nodes]
    assert len(json.dumps(seen)) < len(json.dumps(nodes))
    options = sinfo.parse_args(args)
    render = sinfo.render_json if options.json else sinfo.render_sinfo
    assert render(seen, PARTS, options, NOW) == render(nodes, PARTS, options, NOW)


# ------------------------------------------------------------------ kept collapsed, by changes

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from shoal.server.queueview import Collapsed, PackedPages  # noqa: E402

_CHANGE = st.tuples(
    st.integers(1, 40),  # job id
    st.sampled_from(["PENDING", "RUNNING", None]),  # its new state; None: it leaves the queue
    st.sampled_from([None, 1, 2]),  # its array (None: a plain job)
    st.sampled_from(["a", "b"]),  # name
    st.sampled_from(["gpu", "debug"]),  # partition
    st.sampled_from(["Priority", "Resources", None]),  # reason
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_CHANGE, max_size=12), min_size=1, max_size=8))
def test_the_kept_collapse_is_what_collapsing_the_whole_listing_makes_after_any_changes(batches):
    """Collapsed, brought up to date job by job (as the queue view's refresh does), lists what
    squeue's collapse_arrays makes of the whole listing after every batch of changes."""
    jobs: dict[int, dict] = {}
    kept, packed = Collapsed(page_bits=2), PackedPages()  # pages of 4 ids: rows move between pages
    for batch in batches:
        for jid, state, array, name, partition, reason in batch:
            old = jobs.pop(jid, None)
            if old is not None:
                kept.drop(old)
            if state is None:
                continue
            new = view(job(job_id=jid, state=state, name=name, partition=partition, reason=reason,
                           array_job_id=array, array_task_id=None if array is None else jid % 7,
                           array_throttle=2 if array == 2 else None))
            jobs[jid] = new
            kept.put(new)
        wanted = squeue.collapse_arrays([jobs[j] for j in sorted(jobs)])
        assert kept.rows() == wanted
        pages = kept.pages()
        assert [rows for _, rows in pages] == [rows for _, rows in kept.pages()]  # the same until a change
        assert all(a is b for (_, a), (_, b) in zip(pages, kept.pages()))
        assert squeue.listed_jobs(json.loads(packed.answer(pages, listing.packed_row))) == \
            squeue.listed_jobs(rows_answer(wanted))


def test_a_change_makes_only_its_own_page_again_and_only_that_page_is_encoded_again():
    kept, packed = Collapsed(page_bits=2), PackedPages()
    jobs = {i: view(job(job_id=i, state="PENDING")) for i in range(1, 13)}
    for j in jobs.values():
        kept.put(j)
    before = dict(kept.pages())
    encoded: list[int] = []

    def encode(j: dict) -> tuple[bytes, bytes]:
        encoded.append(j["job_id"])
        return listing.packed_row(j)

    packed.answer(kept.pages(), encode)
    assert sorted(encoded) == list(range(1, 13))
    kept.drop(jobs[5])
    jobs[5] = view(job(job_id=5, state="RUNNING"))
    kept.put(jobs[5])
    after = dict(kept.pages())
    assert [p for p in after if after[p] is not before[p]] == [1]  # ids 4-7
    encoded.clear()
    answer = json.loads(packed.answer(kept.pages(), encode))
    assert encoded == [4, 5, 6, 7]  # page 1's rows only (the view keeps each job's own parts: not here)
    assert squeue.listed_jobs(answer) == squeue.listed_jobs(rows_answer(kept.rows()))


def test_packed_pages_start_their_shared_values_again_once_they_outnumber_the_rows_twice_over():
    kept, packed = Collapsed(), PackedPages()
    j = view(job(job_id=1, state="PENDING"))
    kept.put(j)
    for n in range(1100):  # a job renamed over and over: a new combination each time
        kept.drop(j)
        j = {**j, "name": f"n{n}"}
        kept.put(j)
        answer = json.loads(packed.answer(kept.pages(), listing.packed_row))
        assert squeue.listed_jobs(answer) == [{**j, "array_tasks": None}]
        assert len(answer["shared"]) <= 2 * 1 + 1024 + 1
    assert len(answer["shared"]) < 100
