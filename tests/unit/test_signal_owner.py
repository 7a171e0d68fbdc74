"""swiftslurm/signals.py is the one owner of signal dispositions: it alone says which signals mean stop, save and
dump stacks, and it alone installs, restores and ignores handlers. Checked in this process (no child process)."""

from __future__ import annotations

import ast
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from swiftslurm import signals
from swiftslurm.engines.hooks import StopRequest
from swiftslurm.signals import (
    DUMP_SIGNAL,
    RANK_STOP_SIGNALS,
    SAVE_SIGNAL,
    STOP_SIGNALS,
    SignalLog,
    blocked_in_this_thread,
    ignore_from_now_on,
    ignore_save_signal,
    install,
    restore,
)

PACKAGE = Path(__file__).resolve().parents[2] / "swiftslurm"
OWNER = PACKAGE / "signals.py"
# Calls that change what a signal does to the process; only the owner makes them.
DISPOSITION_CALLS = {
    ("signal", "signal"),
    ("faulthandler", "register"),
    ("signal", "siginterrupt"),
    ("signal", "pthread_sigmask"),
}


def calls(tree: ast.AST) -> Iterator[tuple[str, str, int]]:
    for node in ast.walk(tree):
        function = node.func if isinstance(node, ast.Call) else None
        if isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name):
            yield function.value.id, function.attr, node.lineno


def modules() -> Iterator[tuple[Path, ast.AST]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text())


@pytest.fixture
def dispositions_kept() -> Iterator[None]:
    """Whatever a test does to the stop, save and dump signals, this process gets its own handlers back."""
    every = (*RANK_STOP_SIGNALS, DUMP_SIGNAL)
    kept = {sig: signal.getsignal(sig) for sig in every}
    yield
    restore(kept)


def test_only_signals_py_sets_what_a_signal_does() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {module}.{name}()"
        for path, tree in modules()
        if path != OWNER
        for module, name, line in calls(tree)
        if (module, name) in DISPOSITION_CALLS
    ]
    assert found == [], "call swiftslurm.signals instead:\n" + "\n".join(found)


def test_the_stop_signals_are_defined_once() -> None:
    defined = [
        (path.relative_to(PACKAGE.parent).as_posix(), target.id)
        for path, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name) and target.id.endswith("STOP_SIGNALS")
    ]
    assert defined == [("swiftslurm/signals.py", "STOP_SIGNALS"), ("swiftslurm/signals.py", "RANK_STOP_SIGNALS")]


def test_a_rank_stops_on_every_signal_that_stops_the_wrapper() -> None:
    assert SAVE_SIGNAL == signal.SIGUSR2 and SAVE_SIGNAL in STOP_SIGNALS  # SLURM's warning, `--signal=USR2@N`
    assert set(STOP_SIGNALS) < set(RANK_STOP_SIGNALS)
    assert signal.SIGUSR1 not in STOP_SIGNALS  # NCCL may catch it: the wrapper leaves it alone
    assert DUMP_SIGNAL not in RANK_STOP_SIGNALS  # a stack dump stops nothing


def test_install_then_restore_puts_the_previous_handlers_back(dispositions_kept: None) -> None:
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    seen: list[int] = []
    previous = install(lambda signum, _frame: seen.append(signum))
    signal.raise_signal(signal.SIGTERM)
    assert seen == [signal.SIGTERM] and previous == before
    restore(previous)
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before


def test_a_signal_log_records_only_while_installed(dispositions_kept: None) -> None:
    log = SignalLog()
    with log.installed():
        signal.raise_signal(signal.SIGUSR2)
        signal.raise_signal(signal.SIGINT)
    assert [s for s, _ in log.received] == [signal.SIGUSR2, signal.SIGINT]
    assert all(signal.getsignal(sig) != log.record for sig in STOP_SIGNALS)


def test_ignored_from_now_on_is_the_kernels_ignore(dispositions_kept: None) -> None:
    """SIG_IGN, which interpreter shutdown leaves alone, not a Python handler, which it replaces by SIG_DFL."""
    SignalLog().install()
    ignore_from_now_on()
    assert [signal.getsignal(sig) for sig in STOP_SIGNALS] == [signal.SIG_IGN] * len(STOP_SIGNALS)
    signal.raise_signal(signal.SIGTERM)  # nothing happens


def test_the_trainer_starts_with_the_save_signal_ignored(dispositions_kept: None) -> None:
    from swiftslurm.node import launch

    ignore_save_signal()  # what Popen's preexec_fn runs in the child before `swift` is exec'ed
    assert signal.getsignal(SAVE_SIGNAL) == signal.SIG_IGN
    assert launch.ignore_save_signal is signals.ignore_save_signal


def test_a_rank_records_each_of_its_stop_signals(dispositions_kept: None) -> None:
    for signum in RANK_STOP_SIGNALS:
        stop = StopRequest()
        signal.raise_signal(signum)
        assert stop.requested, signal.Signals(signum).name


def test_the_stack_dump_is_registered_on_the_dump_signal(dispositions_kept: None, tmp_path: Path) -> None:
    import faulthandler

    with open(tmp_path / "stacks", "w") as out:
        signals.dump_stacks_on_signal(out)
        try:
            signal.raise_signal(DUMP_SIGNAL)
        finally:
            faulthandler.unregister(DUMP_SIGNAL)
    assert "test_the_stack_dump_is_registered_on_the_dump_signal" in (tmp_path / "stacks").read_text()


def test_both_rank_plugins_block_the_stop_signals_in_what_their_rank_starts() -> None:
    """At import, before the rank builds its data loader or an inference engine (tests/component/test_rank_children.py
    checks what it does)."""
    for plugin in ("swift_plugin.py", "megatron_plugin.py"):
        tree = ast.parse((PACKAGE / "engines" / plugin).read_text())
        at_import = [
            node.value.func.id
            for node in tree.body
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
        ]
        assert "children_never_see_stop_signals" in at_import, plugin


def test_a_stop_signal_while_a_child_starts_reaches_the_rank_afterwards(dispositions_kept: None) -> None:
    seen: list[int] = []
    install(lambda signum, _frame: seen.append(signum), RANK_STOP_SIGNALS)
    with blocked_in_this_thread(RANK_STOP_SIGNALS):
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR2)  # to this thread, which blocks it
        assert seen == [] and signal.SIGUSR2 in signal.sigpending()
    assert seen == [signal.SIGUSR2] and signal.SIGUSR2 not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
