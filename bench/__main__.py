"""Run every benchmark (or those named on the command line) and print their tables."""

from __future__ import annotations

import asyncio
import sys

from bench import (
    authoring,
    busstate,
    chaos,
    cli,
    crash,
    dataproxy,
    events,
    failover,
    haproxy,
    hostpage,
    imageproxy,
    images,
    install,
    intents,
    kube,
    kvstate,
    lifecycle,
    load,
    network,
    rollback,
    sdkload,
    signin,
    soak,
    startup,
    store,
    streaming,
    theme,
    wake,
    watcher,
)

BENCHES = {
    "watcher": watcher.main,
    "lifecycle": lifecycle.main,
    "dataproxy": dataproxy.main,
    "streaming": streaming.main,
    "soak": soak.main,
    "intents": intents.main,
    "theme": theme.main,
    "install": install.main,
    "events": events.main,
    "crash": crash.main,
    "wake": wake.main,
    "rollback": rollback.main,
    "authoring": authoring.main,
    "sdkload": sdkload.main,
    "signin": signin.main,
    "cli": cli.main,
    "hostpage": hostpage.main,
    "store": store.main,
    "load": load.main,
    "kube": kube.main,
    "startup": startup.main,
    "haproxy": haproxy.main,
    "images": images.main,
    "imageproxy": imageproxy.main,
    "network": network.main,
    "busstate": busstate.main,
    "kvstate": kvstate.main,
    "failover": failover.main,
}
#: not part of a plain `make bench`: `make chaos` runs it (minutes, and it kills shells)
ON_DEMAND = {"chaos": chaos.main}


def main() -> None:
    names = sys.argv[1:] or list(BENCHES)
    for name in names:
        asyncio.run({**BENCHES, **ON_DEMAND}[name]())


if __name__ == "__main__":
    main()
