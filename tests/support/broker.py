"""The embedded broker as a test fixture: a real `agentstream broker` process on a free port.

Contract with infra/broker: `agentstream broker --data-dir D --host 127.0.0.1 --port 0 --ready-file F`
writes "host:port" to F once it accepts connections.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import AGENTSTREAM, Proc, wait_for


@dataclass
class BrokerHandle:
    data_dir: Path
    proc: Proc
    bootstrap: str
    port: int

    def restart(self, kill9: bool = False) -> BrokerHandle:
        """Stop (or kill -9) and start again on the same port and data directory."""
        if kill9:
            self.proc.kill9()
        else:
            self.proc.stop()
        fresh = start_broker(self.data_dir, port=self.port)
        self.proc, self.bootstrap = fresh.proc, fresh.bootstrap
        return self

    def stop(self) -> None:
        self.proc.stop()


def start_broker(data_dir: Path, port: int = 0, extra_args: list[str] | None = None) -> BrokerHandle:
    data_dir.mkdir(parents=True, exist_ok=True)
    ready = data_dir / "broker.ready"
    ready.unlink(missing_ok=True)
    args = [*AGENTSTREAM, "broker", "--data-dir", str(data_dir), "--host", "127.0.0.1", "--port", str(port)]
    args += ["--ready-file", str(ready), *(extra_args or [])]
    proc = Proc(args, data_dir / "broker.log")

    def is_ready():
        if not proc.alive():
            raise RuntimeError(f"broker exited with {proc.popen.returncode}:\n{proc.log_text()[-3000:]}")
        return ready.exists() and ready.read_text().strip()

    address = wait_for(is_ready, timeout_s=30, what="the embedded broker to listen")
    return BrokerHandle(data_dir, proc, address, int(address.rsplit(":", 1)[1]))
