"""The read-only web console (`agentstream console`, and a component of `agentstream up`).

- `config`: ConsoleConfig (options, the API-key rules);
- `data`: what each page shows, from the CLI's queries (`infra.clickhouse.browse`, `.analytics`,
  `infra.status`);
- `charts`: inline SVG charts drawn on the server;
- `app`: the aiohttp application and its pages (`templates/`, `static/`: served by the app itself).
"""
