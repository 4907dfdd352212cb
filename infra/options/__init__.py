"""The option kit every command and benchmark declares its options with: options that fall back to
`AGENTSTREAM_*` environment variables (env.py) and options generated from config dataclasses
(configs.py). A low floor of `infra`: it knows argparse, not the commands that use it."""
