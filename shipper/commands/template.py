"""`shipper template`: print (`--print`) or install the index template for the configured indices.

Exit 0 when installed or already there, 1 when the destination refused it or gave no answer.
The template itself and the install are in ship/template.py; this module prints and returns codes.
"""

from __future__ import annotations

import asyncio
import sys

import orjson

from shipper import settings
from shipper.ship.backoff import Backoff
from shipper.ship.client import BulkClient
from shipper.ship.template import TemplateResult, distribution, ensure_templates
from shipper.ship.template_body import Distribution, build_template

ASSUMED = Distribution("elasticsearch", (8,), "default", "elasticsearch 8 (assumed)")


def template(config_path: str, *, print_only: bool = False, force: bool = False) -> int:
    cfg = settings.load(config_path)

    async def run() -> int:
        client = BulkClient(cfg.output, Backoff(cfg.retry.initial_backoff_s, cfg.retry.max_backoff_s))
        try:
            if print_only:
                dist = await distribution(client)
                if isinstance(dist, TemplateResult) or dist.product == "other":
                    why = dist.detail
                    print(f"shipper: cannot tell the destination's distribution ({why}); "
                          f"printing the template for {ASSUMED.detail}", file=sys.stderr)
                    dist = ASSUMED
                sys.stdout.write(orjson.dumps(build_template(cfg, dist), option=orjson.OPT_INDENT_2).decode() + "\n")
                return 0
            res = await ensure_templates(client, cfg, force=force)
            if res.state in ("installed", "replaced", "exists"):
                print(res.detail + ("; --force replaces it" if res.state == "exists" else ""))
                return 0
            print(f"shipper: index template not installed: {res.detail}", file=sys.stderr)
            return 1
        finally:
            await client.close()

    return asyncio.run(run())
