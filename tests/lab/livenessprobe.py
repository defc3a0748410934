"""The livenessprobe sidecar's part, for the chart's install in the lab.

    livenessprobe.py --csi-address=SOCKET --health-port=PORT

The flags are livenessprobe's own (the chart passes them), and so is the
answer: an HTTP server on PORT (every address, as the sidecar listens)
whose /healthz calls the driver's Probe on SOCKET and says `ok` (200) when
it answers ready, or why not (500), which is what the chart's
livenessProbe of the driver's containers asks. livenessprobe itself cannot
be built here: the Go module proxy serves no version of
github.com/kubernetes-csi/livenessprobe. tests/lab/mkimage.py puts this in
an image of its own.
"""
import http.server
import socket
import sys

import grpc


def flags(argv):
    values = {"csi-address": None, "health-port": None}
    for arg in argv:
        name, sep, value = arg.partition("=")
        if not sep or name[2:] not in values or not name.startswith("--"):
            sys.exit(f"{sys.argv[0]}: unknown argument {arg!r} (flags: --csi-address, --health-port)")
        values[name[2:]] = value
    if None in values.values():
        sys.exit(f"{sys.argv[0]}: both --csi-address and --health-port are needed")
    return values


def main():
    opts = flags(sys.argv[1:])
    channel = grpc.insecure_channel("unix:" + opts["csi-address"])
    probe = channel.unary_unary("/csi.v1.Identity/Probe",
                                request_serializer=bytes, response_deserializer=bytes)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/healthz":
                self.send_error(404)
                return
            try:
                # ProbeResponse: {1 google.protobuf.BoolValue ready}; absent is ready.
                reply = probe(b"", timeout=10)
                ready = not reply or (reply[0] == 0x0A and reply[2:2 + reply[1]] == b"\x08\x01")
                status, body = (200, b"ok") if ready else (500, b"Probe: the driver is not ready")
            except grpc.RpcError as e:
                status, body = 500, f"Probe: {e.code().name}: {e.details()}".encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):
            if not self.path.startswith("/healthz") or args[1:2] != ("200",):
                sys.stderr.write("livenessprobe: " + fmt % args + "\n")

    class DualStack(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6  # "::" takes IPv4 too, as the sidecar's ":PORT"

    try:
        server = DualStack(("::", int(opts["health-port"])), Health)
    except OSError:  # no IPv6 in this network namespace
        server = http.server.ThreadingHTTPServer(("", int(opts["health-port"])), Health)
    print(f"livenessprobe: /healthz on port {opts['health-port']} probes {opts['csi-address']}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
