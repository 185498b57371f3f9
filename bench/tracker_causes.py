"""Real causes of hangs drawn from issue trackers: the bench's second set (issue 37's figures).

    python bench/real_causes.py --set trackers [--case NAME] [--json FILE] [--list] [--verbose]
    python bench/tracker_causes.py [the same options]

Each case is a small program that really hangs the way the report at its ``source`` describes (a
trainer's, PyTorch's, CPython's or a tool's tracker), run by the harness of
``bench/real_causes.py`` (the same five views, the same 3 s limits). None of them is one of that
module's cases. Each gives three regexes, written from what is true about the case, not from what
lora_otel prints today:

- ``place``: where it waits (the program's line, or the library's frame);
- ``cause``: what a right diagnosis must name — the object waited on and its state (the pipe and
  who holds its other end, the path polled and that nothing will create or remove it, the pid that
  is gone); the parts may come in any order, close together (`near`);
- ``advice``: what a step that fixes it says (a view's ``what to do:`` text).
"""

from __future__ import annotations

import itertools
import os
import socket
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_causes import HEAD, TRAINER, Case  # the harness beside this module


def near(*parts: str, within: int = 300) -> str:
    """A regex that finds every part, in any order, on one line, each within ``within`` characters
    of the last: one sentence must say them together (a pid in a view's process list and a word in
    another line's sentence do not make a diagnosis)."""
    gap = r"[^\n]{0,%d}?" % within
    orders = ["(?:%s)" % gap.join("(?:%s)" % p for p in order) for order in itertools.permutations(parts)]
    return "(?i)(?:%s)" % "|".join(orders)


def either(*patterns: str) -> str:
    """Any of ``patterns`` (each `near`'s, or a ``(?i)`` regex)."""
    return "(?i)(?:%s)" % "|".join("(?:%s)" % p.removeprefix("(?i)") for p in patterns)


def _free_port(case_dir: Path) -> tuple:
    """A local port nobody listens on (bound, read, closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return {"port": port}, lambda: None


def _fifo(case_dir: Path) -> tuple:
    """A FIFO left in the data folder, that nothing writes."""
    os.mkfifo(case_dir / "data" / "captions.fifo")
    return {}, lambda: None


def _stale_lock(case_dir: Path) -> tuple:
    """The ``lock`` file a killed build left in the extension's build folder."""
    (case_dir / "build" / "myext").mkdir(parents=True, exist_ok=True)
    (case_dir / "build" / "myext" / "lock").write_text("")
    return {}, lambda: None


WANDB_PROMPT = Case(
    "wandb prompt on the launcher's pipe",
    {
        "job.py": HEAD
        + textwrap.dedent("""\
            import subprocess
            # a UI starts the trainer with stdin a pipe (to send it "stop" later) and never writes
            trainer = subprocess.Popen([sys.executable, "train.py"], stdin=subprocess.PIPE)
            trainer.wait()  # @wait
            """),
        "train.py": TRAINER
        + textwrap.dedent("""\
            import wandb
            mark(ui_pid=os.getppid(), trainer_pid=os.getpid())
            wandb.login()  # @login
            """),
        "wandb/__init__.py": textwrap.dedent("""\
            def login():
                print("wandb: (1) Create a W&B account")
                print("wandb: (2) Use an existing W&B account")
                print("wandb: (3) Don't visualize my results", flush=True)
                return input("wandb: Enter your choice: ")  # @input
            """),
    },
    place=r"train\.py:@login|wandb/__init__\.py:@input",
    cause=near(r"stdin|standard input|descriptor 0|fd 0", r"pipe", r"\b<<ui_pid>>\b"),
    advice=r"(?i)WANDB_MODE|WANDB_API_KEY|wandb (login|offline|disabled)|/dev/null|DEVNULL|stdin=|no(n-)?interactive",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    about="a local wandb.login() prompts on stdin, a pipe its UI launcher holds and never writes",
    source="https://github.com/wandb/wandb/issues/592",
)

TOKEN_TTY = Case(
    "token prompt on a terminal not its own",
    {
        "job.py": HEAD
        + textwrap.dedent("""\
            import pty, subprocess
            master, terminal = pty.openpty()  # the terminal the orchestrator runs in: nobody types there
            run = subprocess.Popen([sys.executable, "run.py"], stdin=terminal, start_new_session=True)
            run.wait()  # @wait
            """),
        "run.py": TRAINER
        + textwrap.dedent("""\
            from huggingface_hub import interpreter_login
            mark(run_pid=os.getpid(), orchestrator_pid=os.getppid())
            interpreter_login()  # @login  (its prompt reads stdin: a terminal, not its controlling one)
            """),
    },
    place=r"run\.py:@login|_login\.py|getpass\.py",
    cause=near(
        r"terminal|tty|pts/",
        r"stdin|standard input|descriptor 0|fd 0|input|token|password",
        r"not its|no controlling|nobody|no one|never|background",
    ),
    advice=r"(?i)HF_TOKEN|--token|(huggingface-cli|hf)( auth)? login|/dev/null|DEVNULL|stdin=",
    env={"LORA_OTEL_STALL_AFTER": "between=3", "HF_HOME": "hf_home"},
    needs=("huggingface_hub",),
    about="huggingface_hub.interpreter_login() in a job started headless: its prompt reads a terminal nobody types in",
    source="https://github.com/tenstorrent/tt-inference-server/pull/5032",
)

VLLM_SERVER = Case(
    "vLLM server not up",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            from vllm_client import VLLMClient
            port = int(open("ctx_port").read())
            mark()
            client = VLLMClient(host="127.0.0.1", server_port=port, connection_timeout=600)  # @client
            """),
        # trl's VLLMClient.check_server (trl/generation/vllm_client.py), without the vllm import it needs
        "vllm_client.py": textwrap.dedent("""\
            import logging, time
            import requests
            logger = logging.getLogger(__name__)

            class VLLMClient:
                def __init__(self, host="0.0.0.0", server_port=8000, connection_timeout=0.0):
                    self.base_url = f"http://{host}:{server_port}"
                    self.check_server(connection_timeout)

                def check_server(self, total_timeout=0.0, retry_interval=2.0):
                    url = f"{self.base_url}/health/"
                    start_time = time.time()
                    while True:
                        try:
                            response = requests.get(url)  # @get
                        except requests.exceptions.RequestException as exc:
                            if time.time() - start_time >= total_timeout:
                                raise ConnectionError(f"The vLLM server can't be reached at {self.base_url}") from exc
                        else:
                            if response.status_code == 200:
                                return
                        logger.info(f"Server is not up yet. Retrying in {retry_interval} seconds...")
                        time.sleep(retry_interval)  # @sleep
            """),
    },
    place=r"job\.py:@client|vllm_client\.py:(@get|@sleep)",
    cause=near(
        r"(127\.0\.0\.1|localhost):<<port>>|port <<port>>", r"nobody|no one|nothing|no process|refused|not listen"
    ),
    advice=r"(?i)(start|launch|run)[^\n]{0,80}(server|vllm|<<port>>)|vllm(-| )serve|<<port>>[^\n]{0,80}listen",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    needs=("requests",),
    setup=_free_port,
    about="TRL's VLLMClient.check_server polls /health/ of a vLLM server never started (connection refused)",
    source="https://github.com/huggingface/open-r1/issues/568",
)

STORE_NO_MASTER = Case(
    "rank 1 without rank 0's store",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            import datetime
            import torch.distributed as dist
            os.environ["MASTER_PORT"] = open("ctx_port").read()  # rank 0's store would listen there
            mark()
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))  # @init
            """),
    },
    place=r"job\.py:@init|rendezvous|TCPStore|init_process_group",
    # the store's address and that nobody listens there, or that rank 0 (which would listen) never started
    cause=either(
        near(
            r"(127\.0\.0\.1|localhost):<<port>>|port <<port>>", r"nobody|no one|nothing|no process|refused|not listen"
        ),
        near(r"rank 0", r"never started|not started|not running|no process|nobody|not listening"),
    ),
    advice=r"(?i)(start|launch|run)[^\n]{0,60}rank 0|MASTER_(ADDR|PORT)",
    env={
        "LORA_OTEL_STALL_AFTER": "between=3",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "OMP_NUM_THREADS": "1",
    },
    needs=("torch",),
    setup=_free_port,
    about="rank 1 of 2 in init_process_group (env://); rank 0, whose TCPStore it connects to, never started",
    source="https://github.com/pytorch/pytorch/issues/52848",
)

STALE_BATON = Case(
    "stale torch_extensions lock",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            from torch.utils.cpp_extension import load
            mark()
            ext = load(name="myext", sources=["myext.cpp"], build_directory="build/myext")  # @load
            """),
        "myext.cpp": "int answer() { return 42; }\n",
    },
    place=r"job\.py:@load|file_baton\.py|cpp_extension\.py",
    cause=near(r"build/myext/lock", r"no process|nobody|no one|not held|stale|left (by|behind)|holds? it"),
    advice=r"(?i)(remove|delete|rm)\b[^\n]{0,80}build/myext/lock",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    needs=("torch",),
    setup=_stale_lock,
    about="cpp_extension.load() waits for ever on the lock file a killed build left (FileBaton)",
    source="https://github.com/pytorch/pytorch/issues/189245",
)

QUEUE_JOIN = Case(
    "join before draining a Queue",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            import multiprocessing

            def produce(results):
                results.put(b"x" * 1000000)  # @put  (a result bigger than a pipe holds)

            if __name__ == "__main__":
                results = multiprocessing.Queue()
                p = multiprocessing.Process(target=produce, args=(results,))
                p.start()
                mark(child_pid=p.pid, parent_pid=os.getpid())
                p.join()  # @join  (the queue is read only after the join)
                print(len(results.get()))
            """),
    },
    place=r"job\.py:@join|job\.py:@put",
    cause=near(r"\b<<child_pid>>\b", r"pipe|queue", r"full|read|drain|parent|feeder"),
    advice=r"(?i)(get|drain|read|empty)[^\n]{0,80}(before|then)[^\n]{0,40}join|join[^\n]{0,80}after|cancel_join_thread",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    about="the parent joins a child whose Queue feeder blocks on a full pipe the parent reads only after",
    source="https://github.com/python/cpython/issues/91594",
)

LOCK_OF_KILLED = Case(
    "multiprocessing.Lock of a killed worker",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            import multiprocessing, signal

            def work(lock):
                lock.acquire()
                os.kill(os.getpid(), signal.SIGKILL)  # @kill  (the OOM killer, inside the critical section)

            if __name__ == "__main__":
                lock = multiprocessing.Lock()
                p = multiprocessing.Process(target=work, args=(lock,))
                p.start()
                p.join()
                mark(killed_pid=p.pid)
                with lock:  # @acquire
                    pass
            """),
    },
    place=r"job\.py:@acquire",
    cause=near(r"\b<<killed_pid>>\b", r"lock|semaphore", r"killed|died|dead|gone|SIGKILL"),
    advice=r"(?i)restart|re-?run|start[^\n]{0,40}again|flock|filelock",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    about="a worker SIGKILLed while holding a multiprocessing.Lock; the parent then waits on that lock",
    source="https://github.com/birdnet-team/birdnet/issues/73",
)

GRANDCHILD_PIPE = Case(
    "grandchild holds the output pipe",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            import subprocess
            out = subprocess.check_output([sys.executable, "prep.py"])  # @check
            """),
        "prep.py": HEAD
        + textwrap.dedent("""\
            import subprocess
            helper = subprocess.Popen([sys.executable, "helper.py"])  # inherits stdout: the job's pipe
            print("prepared", flush=True)
            mark(helper_pid=helper.pid, prep_pid=os.getpid())
            """),
        "helper.py": HEAD
        + textwrap.dedent("""\
            while True:  # a tensorboard-like server, quiet
                time.sleep(0.5)  # @serve
            """),
    },
    place=r"job\.py:@check",
    cause=near(r"pipe", r"\b<<helper_pid>>\b"),
    advice=r"(?i)DEVNULL|/dev/null|redirect|close_fds|stdout=|(kill|stop)[^\n]{0,40}<<helper_pid>>",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    about="check_output() of a step that exited, whose background helper still holds the output pipe",
    source="https://github.com/python/cpython/issues/75893",
)

FIFO_DATA = Case(
    "FIFO in the data folder",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            texts = []
            mark()
            for name in sorted(os.listdir("data")):
                with open(os.path.join("data", name)) as f:  # @open
                    texts.append(f.read())
            """),
        "data/a.txt": "a photo of a cat\n",
        "data/b.txt": "a photo of a dog\n",
    },
    place=r"job\.py:@open",
    cause=near(r"captions\.fifo", r"FIFO|named pipe", r"no (process|one|writer)|nobody|nothing"),
    advice=(
        r"(?i)(remove|delete|move|skip|exclude)[^\n]{0,80}(captions\.fifo|FIFO|named pipe)"
        r"|(start|run)[^\n]{0,60}writ"
    ),
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    setup=_fifo,
    about="a caption loader opens every file in data/; one is a FIFO nothing writes",
    source="https://github.com/pypa/scripttest/pull/7",
)

LOCK_AT_FORK = Case(
    "lock held at fork",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            import multiprocessing, threading
            cache_lock = threading.Lock()

            def refresh():
                with cache_lock:
                    time.sleep(1.0)  # a background refresh holds the lock for a second

            def load(i):
                with cache_lock:  # @child  (the lock was held when this process was forked)
                    return i

            if __name__ == "__main__":
                threading.Thread(target=refresh, name="cache-refresh", daemon=True).start()
                time.sleep(0.2)
                p = multiprocessing.get_context("fork").Process(target=load, args=(0,))
                p.start()
                mark(child_pid=p.pid)
                p.join()  # @join
            """),
    },
    place=r"job\.py:@child|job\.py:@join",
    cause=near(r"\b<<child_pid>>\b", r"lock", r"fork"),
    advice=r"(?i)spawn|forkserver|set_start_method|get_context|register_at_fork|(before|after)[^\n]{0,20}fork",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    about="a fork while a thread holds a lock: the child waits for a lock no thread of it will release",
    source="https://github.com/pytorch/pytorch/issues/75147",
)

OMP_FORK = Case(
    "OpenMP pool lost in a fork",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            import torch.multiprocessing as mp

            def foo():
                x = torch.ones((2, 50, 10))
                return torch.einsum("ijl,ikl->ijk", x, x)  # @einsum

            if __name__ == "__main__":
                foo()  # the parent's OpenMP threads start here
                p = mp.Process(target=foo)
                p.start()
                mark(child_pid=p.pid)
                p.join()  # @join
            """),
    },
    place=r"job\.py:@einsum|job\.py:@join",
    cause=near(r"OpenMP|libgomp|gomp", r"fork"),
    advice=r"(?i)spawn|forkserver|set_start_method|OMP_NUM_THREADS=1|set_num_threads\(1\)",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    needs=("torch",),
    about="a torch op in the parent, then the same op in a forked child: libgomp's pool is gone there",
    source="https://github.com/pytorch/pytorch/issues/17199",
)

SERVICE_SILENT = Case(
    "local service stops answering",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            import socket, subprocess
            service = subprocess.Popen([sys.executable, "service.py"])
            while not os.path.exists("service.port"):
                time.sleep(0.05)
            port = int(open("service.port").read())
            conn = socket.create_connection(("127.0.0.1", port))
            mark(service_pid=service.pid, port=port)
            conn.sendall(b"log step=1 loss=0.5\\n")
            reply = conn.recv(64)  # @recv
            """),
        "service.py": HEAD
        + textwrap.dedent("""\
            import socket, threading
            srv = socket.socket()
            srv.bind(("127.0.0.1", 0))
            srv.listen(1)
            open("service.port.tmp", "w").write(str(srv.getsockname()[1]))
            os.rename("service.port.tmp", "service.port")
            state = threading.Lock()
            state.acquire()  # its writer thread died holding this
            conn, _ = srv.accept()
            conn.recv(64)
            with state:  # @stuck
                conn.sendall(b"ok")
            """),
    },
    place=r"job\.py:@recv",
    cause=near(
        r"\b<<service_pid>>\b",
        r"socket|127\.0\.0\.1:<<port>>|connection",
        r"stuck|not answer|no answer|never (answers|replies)|does not (reply|answer)|waits|blocked|lock",
    ),
    advice=r"(?i)(restart|kill|stop)[^\n]{0,60}(<<service_pid>>|service)|service\.py:@stuck",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    about="the trainer waits for a reply from its own logging service process, which is stuck on a lock",
    source="https://github.com/wandb/wandb/issues/3223",
)

PREFETCH_DIED = Case(
    "prefetch thread died",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            import queue, threading
            batches = queue.Queue(maxsize=4)

            def prefetch():
                for i in range(100):
                    if i == 3:
                        raise OSError("corrupt shard: data/shard-0003.tar")  # @raise
                    batches.put(i)

            threading.Thread(target=prefetch, name="prefetch", daemon=True).start()
            for step in range(100):
                if step == 3:
                    mark()
                batch = batches.get()  # @get
            """),
    },
    place=r"job\.py:@get",
    cause=near(r"prefetch", r"OSError|corrupt shard|raised|died|ended|exited|exception|gone"),
    advice=r"(?i)shard-0003|OSError|propagat|re-?raise|timeout=",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    about="the main loop waits on a queue.Queue whose only producer thread died with an exception",
    source="https://github.com/RadarML/red-rover/issues/23",
)

EXIT_THREAD = Case(
    "exit waits for a monitor thread",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            import threading

            class GpuMonitor(threading.Thread):
                def __init__(self):
                    super().__init__(name="GpuMonitor")
                    self.stop_event = threading.Event()

                def run(self):
                    while not self.stop_event.is_set():
                        time.sleep(0.5)  # @poll  (samples GPU use)

            monitor = GpuMonitor()
            monitor.start()
            model = torch.nn.Linear(4, 1)
            for step in range(3):
                model(torch.ones(1, 4)).sum().backward()
            mark()
            raise RuntimeError("bad config: lr must be positive")  # @raise  (monitor.stop_event.set() never runs)
            """),
    },
    place=r"job\.py:@poll|job\.py:@raise|_shutdown|GpuMonitor",
    cause=near(r"GpuMonitor", r"exit|shut|non-daemon|daemon"),
    advice=r"(?i)daemon|stop_event|\.set\(\)|finally",
    env={"LORA_OTEL_STALL_AFTER": "between=3,exit=3"},
    about="training raises; the interpreter then waits at exit for a non-daemon monitor thread nobody stops",
    source="https://github.com/lincc-frameworks/hyrax/pull/1011",
)

STDIN_OPEN = Case(
    "encoder waits for stdin to close",
    {
        "job.py": TRAINER
        + textwrap.dedent("""\
            import subprocess
            enc = subprocess.Popen([sys.executable, "encode.py"], stdin=subprocess.PIPE)
            for i in range(10):
                enc.stdin.write(b"frame %d\\n" % i)
            enc.stdin.flush()
            mark(encoder_pid=enc.pid, job_pid=os.getpid())
            enc.wait()  # @wait  (stdin never closed: the encoder waits for more frames)
            """),
        "encode.py": HEAD
        + textwrap.dedent("""\
            frames = 0
            for line in sys.stdin.buffer:  # @read
                frames += 1
            print("encoded", frames)
            """),
    },
    place=r"job\.py:@wait|encode\.py:@read",
    cause=near(
        r"\b<<encoder_pid>>\b",
        r"stdin|standard input|pipe",
        r"\b<<job_pid>>\b|parent|never clos|not closed|left open|keeps? it open|holds? (it|the write)",
    ),
    advice=r"(?i)close[^\n]{0,40}(stdin|pipe)|communicate",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    about="the job waits for its encoder, which reads stdin to its end; the job never closes that pipe",
    source="https://github.com/corrscope/corrscope/pull/52",
)

RANK_FILE = Case(
    "rank polls for a file a dead rank writes",
    {
        "job.py": HEAD
        + textwrap.dedent("""\
            import subprocess
            ranks = [
                subprocess.Popen([sys.executable, "train.py"], env=dict(os.environ, RANK=str(r)))
                for r in range(2)
            ]
            for p in ranks:
                p.wait()
            """),
        "train.py": TRAINER
        + textwrap.dedent("""\
            import signal
            rank = int(os.environ["RANK"])
            time.sleep(1.5)  # a job by now (its first beat)
            if rank == 0:
                open("ctx_dead_pid", "w").write(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)  # @kill  (the OOM killer, before the save)
                os.makedirs("ckpt/final")
            else:
                time.sleep(0.5)
                mark(waiter_pid=os.getpid())
                while not os.path.exists("ckpt/final"):  # rank 0 saves the final checkpoint
                    time.sleep(1)  # @poll
            """),
    },
    place=r"train\.py:@poll",
    cause=near(r"ckpt/final", r"\b<<dead_pid>>\b|rank 0", r"killed|died|dead|gone|SIGKILL|exited"),
    advice=r"(?i)restart|re-?run|start[^\n]{0,40}again|resume",
    env={"LORA_OTEL_STALL_AFTER": "between=3"},
    about="rank 1 polls for ckpt/final, which rank 0 writes; rank 0 was SIGKILLed before",
    source="https://github.com/allenai/OLMo/pull/235",
)

CASES = [
    WANDB_PROMPT,
    TOKEN_TTY,
    VLLM_SERVER,
    STORE_NO_MASTER,
    STALE_BATON,
    QUEUE_JOIN,
    LOCK_OF_KILLED,
    GRANDCHILD_PIPE,
    FIFO_DATA,
    LOCK_AT_FORK,
    OMP_FORK,
    SERVICE_SILENT,
    PREFETCH_DIED,
    EXIT_THREAD,
    STDIN_OPEN,
    RANK_FILE,
]


if __name__ == "__main__":
    import real_causes

    sys.exit(real_causes.main(["--set", "trackers", *sys.argv[1:]]))
