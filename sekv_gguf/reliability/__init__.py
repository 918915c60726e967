"""Reliability harnesses (issue: fuzzed inputs, soak, a served API that holds): ``fuzz`` damages every file we parse,
``storm`` sends a served model a mix of valid and hostile requests, ``soak`` runs a policy for many steps and many
open/close cycles. Tests run short versions; ``scripts/`` run the long ones into ``bench/reliability.json``."""
