"""The private Docker engine the Docker sandbox runs on, and the sandbox image it holds.

One `dockerd` per state directory (default `/var/tmp/agentstream-sandbox-engine`, or
`AGENTSTREAM_SANDBOX_ENGINE_DIR`): its own data root, exec root, socket and pid file; no bridge, no
iptables rules, no ip forwarding, no masquerading, so the host's network is left as it was (a stock
`dockerd` creates a 172.17/16 bridge and NAT rules and turns ip_forward on). The image is built
without a registry from Debian packages and reused when the engine holds it.

Two sessions never run two engines on one data root. `control.lock` (an exclusive `fcntl` lock) is
held while one process starts the engine and builds the image, or stops it; a second session waits
for it, then finds the engine running and reuses it. Every user (a test session) holds a shared lock
on `users.lock` for as long as it uses the engine; at the end a user stops the engine only when no
other user holds that lock and a session started it (`owner` file: "session"), so an engine a person
started with `agentstream sandbox-engine up` ("user") keeps running for them.

Parts: `errors` (the exceptions), `host` (processes by PID, mounts, locks: what is undone on the
host), `image` (mmdebstrap + import), `engine` (`SandboxEngine`, `EngineLease`, `Setup`).
"""
