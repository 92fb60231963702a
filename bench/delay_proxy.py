"""A TCP proxy that holds every chunk for DELAY_S seconds in each direction, so each round trip through it gains
2 x DELAY_S: a stand-in for a fleet far from its control machine (the lab's hosts answer in a fraction of a ms).

    python3 bench/delay_proxy.py DELAY_S LISTEN_PORT:HOST:PORT [LISTEN_PORT:HOST:PORT ...]

Point an inventory's hosts at it (`ssh_hostname: 127.0.0.1`, `ssh_port: LISTEN_PORT`, and a known_hosts file whose
entries name `[127.0.0.1]:LISTEN_PORT`). Used for the lock-and-read figures at a 20 ms round trip in
bench/HISTORY.md; not part of `make bench`. Stdlib only; order within each direction is kept.
"""

import asyncio
import socket
import sys
import time


async def pump(reader, writer, delay):
    queue: asyncio.Queue = asyncio.Queue()

    async def read():
        while True:
            data = await reader.read(65536)
            await queue.put((time.monotonic() + delay, data))
            if not data:
                return

    async def write():
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                try:
                    writer.write_eof()
                except OSError:
                    pass
                return
            writer.write(data)
            await writer.drain()

    await asyncio.gather(read(), write())


async def handle(client_reader, client_writer, host, port, delay):
    server_reader, server_writer = await asyncio.open_connection(host, port)
    for w in (client_writer, server_writer):
        w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        await asyncio.gather(pump(client_reader, server_writer, delay), pump(server_reader, client_writer, delay))
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        client_writer.close()
        server_writer.close()


async def main(delay: float, specs: list[str]) -> None:
    servers = []
    for spec in specs:
        listen, host, port = spec.split(":")
        servers.append(await asyncio.start_server(
            lambda r, w, h=host, p=int(port): handle(r, w, h, p, delay), "127.0.0.1", int(listen)))
    await asyncio.gather(*(server.serve_forever() for server in servers))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    asyncio.run(main(float(sys.argv[1]), sys.argv[2:]))
