"""Helper threads of this process that share a generated product's panels with the thread that calls it.

A decode step calls a few hundred products of 10-60 us each on one core.
Shared through XLA's CPU pool (``ThreadPool_Schedule``), each product woke
a pool thread that was often asleep, and it started some 10 us after the
call: measured on an AVX2 AMD EPYC (Zen 3, 2 cores), a chain of dependent
one-row int8 products of a 192 x 576 weight took 11.3 us each on two cores
against 9.0 on one, a float32 one 31.5 against 30.8, and a whole int8
decode step was 1.05 times its one-core speed.  So the products share their
panels with helper threads of their own, which stay awake between them.

``@egraft_pool_share(work, job, threads)`` (the one function this module
exports; a product's FFI handler calls it, ``runtime.llvm_ffi``): the
calling thread takes the pool's one job slot (if another thread holds it,
it computes the product alone), starts ``threads - 1`` helpers the first
time (:data:`MAX_HELPERS` at most), publishes ``work(job)``, runs
``work(job)`` itself (``work`` claims panels one at a time until none is
left), then closes the slot and waits for every helper that joined to
leave.  The job lives on the caller's stack: no helper can reach it once
the slot is closed and drained.  A helper spins on the slot (yielding the
core every :data:`SPIN` loads), joins a job it has not worked on, runs
``work`` and leaves; after :data:`AWAKE` yields without a job it polls
every :data:`NAP_US` microseconds instead, so an idle process keeps its
cores.  The caller never waits for a helper to start, so a late, asleep or
missing helper (a forked child has none) only means the caller computes
more panels; the values never depend on it (each panel is computed by one
thread, in one order).

The gate word holds the slot's state: bit 62 open, the low bits the
helpers inside.  (The caller's drain yields the core every :data:`SPIN` loads too: a process pinned to one
core after XLA sized its pool for two has a helper on the caller's own core.)  A helper joins with a compare-and-swap on an open gate
(then reads the job and its epoch, stable while it is inside) and leaves by
decrementing it; the caller opens it after writing the job and epoch, and
closes it before it drains, so a helper either joined the published job or
finds the gate closed.
"""

from __future__ import annotations

import threading

from .llvm_ffi import MAX_THREADS

SYMBOL = "egraft_pool_share"
MAX_HELPERS = MAX_THREADS - 1  # helper threads at most (the caller is the other one)
SPIN = 64  # loads of the gate between two yields of the core while awake
AWAKE = 20000  # yields without a job (some milliseconds) before a helper naps
NAP_US = 200  # a napping helper's poll interval

OPEN = 1 << 62

IR = f"""
@gate = internal global i64 0
@owner = internal global i64 0
@work = internal global ptr null
@job = internal global ptr null
@epoch = internal global i64 0
@started = internal global i64 0
@joined = internal global i64 0

declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_detach(i64)
declare i32 @sched_yield()
declare i32 @usleep(i32)

define internal ptr @helper_main(ptr %arg) {{
entry:
  br label %wait
wait:
  %last = phi i64 [0, %entry], [%last, %back], [%last, %closed], [%e, %left], [%last, %yield_now], [%last, %nap]
  %idle = phi i64 [0, %entry], [%idle, %back], [%idle, %closed], [0, %left], [%idle2, %yield_now], [%idle2, %nap]
  %spins = phi i64 [0, %entry], [%spins1, %back], [%spins, %closed], [0, %left], [0, %yield_now], [0, %nap]
  %g = load atomic i64, ptr @gate acquire, align 8
  %open = icmp uge i64 %g, {OPEN}
  br i1 %open, label %fresh, label %idle_step
fresh:
  %e0 = load atomic i64, ptr @epoch acquire, align 8
  %new = icmp ne i64 %e0, %last
  br i1 %new, label %join, label %idle_step
join:
  %g1 = add i64 %g, 1
  %cas = cmpxchg ptr @gate, i64 %g, i64 %g1 acq_rel acquire
  %ok = extractvalue {{ i64, i1 }} %cas, 1
  br i1 %ok, label %inside, label %closed
closed:
  br label %wait
inside:
  %e = load atomic i64, ptr @epoch acquire, align 8
  %same = icmp eq i64 %e, %last
  br i1 %same, label %left, label %run
run:
  %jn = atomicrmw add ptr @joined, i64 1 monotonic
  %w = load ptr, ptr @work
  %j = load ptr, ptr @job
  call void %w(ptr %j)
  br label %left
left:
  %d = atomicrmw sub ptr @gate, i64 1 release
  br label %wait
idle_step:
  %spins1 = add i64 %spins, 1
  %give = icmp uge i64 %spins1, {SPIN}
  br i1 %give, label %yield, label %back
back:
  br label %wait
yield:
  %idle2 = add i64 %idle, 1
  %asleep = icmp uge i64 %idle2, {AWAKE}
  br i1 %asleep, label %nap, label %yield_now
yield_now:
  %y = call i32 @sched_yield()
  br label %wait
nap:
  %n = call i32 @usleep(i32 {NAP_US})
  br label %wait
}}

define internal void @start(i64 %want) {{
entry:
  %tid = alloca i64
  %have = load atomic i64, ptr @started acquire, align 8
  %more = icmp ult i64 %have, %want
  br i1 %more, label %claim, label %done
claim:
  %cas = cmpxchg ptr @started, i64 %have, i64 %want acq_rel acquire
  %ok = extractvalue {{ i64, i1 }} %cas, 1
  br i1 %ok, label %spawn, label %done
spawn:
  %i = phi i64 [%have, %claim], [%i1, %next]
  %rc = call i32 @pthread_create(ptr %tid, ptr null, ptr @helper_main, ptr null)
  %t = load i64, ptr %tid
  %started_ok = icmp eq i32 %rc, 0
  br i1 %started_ok, label %detach, label %next
detach:
  %dr = call i32 @pthread_detach(i64 %t)
  br label %next
next:
  %i1 = add i64 %i, 1
  %again = icmp ult i64 %i1, %want
  br i1 %again, label %spawn, label %done
done:
  ret void
}}

define void @{SYMBOL}(ptr %fn, ptr %jb, i64 %threads) {{
entry:
  %few = icmp ult i64 %threads, 2
  br i1 %few, label %alone, label %helpers
helpers:
  %h0 = sub i64 %threads, 1
  %h = call i64 @llvm.umin.i64(i64 %h0, i64 {MAX_HELPERS})
  call void @start(i64 %h)
  %cas = cmpxchg ptr @owner, i64 0, i64 1 acq_rel acquire
  %mine = extractvalue {{ i64, i1 }} %cas, 1
  br i1 %mine, label %publish, label %alone
alone:
  call void %fn(ptr %jb)
  ret void
publish:
  store ptr %fn, ptr @work
  store ptr %jb, ptr @job
  %e = load i64, ptr @epoch
  %e1 = add i64 %e, 1
  store atomic i64 %e1, ptr @epoch release, align 8
  store atomic i64 {OPEN}, ptr @gate release, align 8
  call void %fn(ptr %jb)
  %c = atomicrmw and ptr @gate, i64 {OPEN - 1} acq_rel
  br label %drain
drain:
  %t = phi i64 [0, %publish], [%t1, %wait_more], [0, %pass]
  %g = load atomic i64, ptr @gate acquire, align 8
  %empty = icmp eq i64 %g, 0
  %t1 = add i64 %t, 1
  %long = icmp uge i64 %t1, {SPIN}
  br i1 %empty, label %free, label %wait_more
wait_more:
  br i1 %long, label %pass, label %drain
pass:
  %y = call i32 @sched_yield()
  br label %drain
free:
  store atomic i64 0, ptr @owner release, align 8
  ret void
}}

define void @egraft_pool_stats(ptr %out) {{
entry:
  %h = load atomic i64, ptr @started acquire, align 8
  %j = load atomic i64, ptr @joined acquire, align 8
  store i64 %h, ptr %out
  %o1 = getelementptr i64, ptr %out, i64 1
  store i64 %j, ptr %o1
  ret void
}}

declare i64 @llvm.umin.i64(i64, i64)
"""


_LOCK = threading.Lock()
_ENGINE: list = []  # the pool's compiled module, once made (alive for the process: helpers run its code)


def ensure(target_machine) -> None:
    """Compile the pool's module for this process with `target_machine` (``llvm_kernels``'), once, and make its
    entry point known to LLVM under :data:`SYMBOL` for the products' modules to link against (before any of
    them is finalised); the helpers start on the first shared product."""
    import llvmlite.binding as llvm

    with _LOCK:
        if not _ENGINE:
            mod = llvm.parse_assembly(IR)
            mod.verify()
            engine = llvm.create_mcjit_compiler(mod, target_machine)
            engine.finalize_object()
            llvm.add_symbol(SYMBOL, engine.get_function_address(SYMBOL))
            _ENGINE.append(engine)


def stats() -> dict[str, int]:
    """This process's helpers started so far, and the jobs they joined and worked on (none before the first
    generated product was made)."""
    import ctypes

    with _LOCK:
        if not _ENGINE:
            return {"helpers": 0, "joined": 0}
        address = _ENGINE[0].get_function_address("egraft_pool_stats")
    out = (ctypes.c_int64 * 2)()
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address)(ctypes.addressof(out))
    return {"helpers": int(out[0]), "joined": int(out[1])}


__all__ = ["AWAKE", "IR", "MAX_HELPERS", "NAP_US", "SPIN", "SYMBOL", "ensure", "stats"]
