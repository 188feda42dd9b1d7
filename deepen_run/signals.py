"""Setting signal handlers the way every deepen-run command does (run/stop.py, the sweep launcher,
`make ui`, `deepen-export`)."""
from __future__ import annotations

import signal
import threading


def catch(signals, handler) -> dict:
    """Handle `signals` with `handler` (main thread only) -> the handlers replaced. One ignored at start
    stays ignored, as Python leaves SIGINT: nohup's SIGHUP (the run outlives its terminal), `cmd &`'s SIGINT."""
    main = threading.current_thread() is threading.main_thread()
    return {sig: signal.signal(sig, handler) for sig in signals if main and signal.getsignal(sig) != signal.SIG_IGN}
