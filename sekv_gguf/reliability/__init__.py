"""Reliability harnesses (issue: fuzzed inputs, soak, a served API that holds): ``fuzz`` damages every file we parse,
``storm`` sends a served model a mix of valid and hostile requests, ``soak`` runs a policy for many steps and many
open/close cycles. Tests run short versions; ``scripts/`` run the long ones into ``bench/reliability.json``."""


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` (Linux /proc; 0 where it is not listed)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
