"""Two clients share a lease (``docs/service-guide.md``).

    python docs/examples/lease_demo.py 0=127.0.0.1:PORT,1=127.0.0.1:PORT,2=127.0.0.1:PORT

Runs under asyncio here; the client library runs under Trio the same way.
"""

from __future__ import annotations

import sys

import anyio
from leases import LeaseClient

import client


# --8<-- [start:demo]
async def main(endpoints: str) -> None:
    async with client.connect(endpoints) as a, client.connect(endpoints) as b:
        alice, bob = LeaseClient(a), LeaseClient(b)
        reply = await alice.acquire("printer", ttl=0.5)
        print("alice acquires:", reply.granted)
        reply = await bob.acquire("printer", ttl=30)
        held_by_alice = reply.holder == a.cluster_session_id
        print("bob acquires:", reply.granted, "- alice holds it:", held_by_alice)
        await anyio.sleep(2)  # alice does not renew: her lease expires on every member
        print("bob acquires after the expiry:", (await bob.acquire("printer", ttl=30)).granted)
        print("alice releases it:", (await alice.release("printer")).granted)
        print("bob releases it:", (await bob.release("printer")).granted)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
# --8<-- [end:demo]
