"""Pallas evaluation harness: ``pallas replay`` and its pieces.

Runs in the agent's environment (``.venv/agent``). It starts the vLLM servers with the Pallas
KV connector, one agent beside each, and the xApp in test mode (in the xApp's environment), each
as its own process over real gRPC on loopback; replays an E2 trace; drives one UE client per UE;
and reports SIT and ITL per scheme (docs/model.md §7).
"""
