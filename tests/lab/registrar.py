"""The registration half of node-driver-registrar, for the lab's kubelet.

    registrar.py --csi-address=SOCKET --kubelet-registration-path=PATH
                 [--plugin-registration-path=DIR]

The flags are node-driver-registrar's own (the chart passes them), and so is
what it does with them, as far as kubelet sees: it asks the driver on
--csi-address for its name (GetPluginInfo, waiting until the driver
answers), then serves kubelet's plugin registration API (package
`pluginregistration`, service `Registration`, kubelet 1.20's
pkg/kubelet/apis/pluginregistration/v1/api.proto) on
DIR/<driver>-reg.sock (DIR defaults to /registration, the chart's mount of
kubelet's plugins_registry folder). kubelet calls GetInfo, which answers
with PATH as the endpoint; kubelet then calls the driver's NodeGetInfo
itself, writes the CSINode and the Node's annotation, and reports the
outcome with NotifyRegistrationStatus, which this prints. Removing the
socket (on SIGTERM) unregisters the driver.

node-driver-registrar itself cannot be built here: the Go module proxy
serves no version of github.com/kubernetes-csi/node-driver-registrar. The
lab runs this script from the host (tests/src/kubelet.rs) and, for the
chart's install, in an image of its own (tests/lab/mkimage.py).

The messages are encoded by hand (no generated code): PluginInfo is
{1 type, 2 name, 3 endpoint, 4 repeated supported_versions}, all strings;
RegistrationStatus is {1 bool plugin_registered, 2 string error};
GetPluginInfoResponse's field 1 is the driver's name.
"""
import os
import signal
import sys
from concurrent import futures

import grpc


def field(number, text):
    data = text.encode()
    assert len(data) < 128
    return bytes([number << 3 | 2, len(data)]) + data


def varint(data, i):
    value = shift = 0
    while True:
        value |= (data[i] & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if data[i - 1] < 0x80:
            return value, i


def decode(data):
    fields, i = {}, 0
    while i < len(data):
        key, i = varint(data, i)
        if key & 7 == 0:
            fields[key >> 3], i = varint(data, i)
        else:
            size, i = varint(data, i)
            fields[key >> 3] = data[i:i + size].decode()
            i += size
    return fields


def flags(argv, names):
    """--name=value flags; every name in `names` is required unless it has
    a default there."""
    values = dict(names)
    for arg in argv:
        name, sep, value = arg.partition("=")
        if not sep or not name.startswith("--") or name[2:] not in values:
            sys.exit(f"{sys.argv[0]}: unknown argument {arg!r} (flags: {', '.join(values)})")
        values[name[2:]] = value
    missing = [n for n, v in values.items() if v is None]
    if missing:
        sys.exit(f"{sys.argv[0]}: missing --{', --'.join(missing)}")
    return values


def driver_name(csi_address):
    """GetPluginInfo's name, waiting (as node-driver-registrar does) until
    the driver's socket answers."""
    channel = grpc.insecure_channel("unix:" + csi_address)
    call = channel.unary_unary("/csi.v1.Identity/GetPluginInfo",
                               request_serializer=bytes, response_deserializer=bytes)
    reply = decode(call(b"", wait_for_ready=True, timeout=600))
    channel.close()
    return reply[1]


def main():
    opts = flags(sys.argv[1:], {"csi-address": None, "kubelet-registration-path": None,
                                "plugin-registration-path": "/registration"})
    driver = driver_name(opts["csi-address"])
    endpoint = opts["kubelet-registration-path"]
    sock = os.path.join(opts["plugin-registration-path"], driver + "-reg.sock")

    def get_info(_request, _context):
        print(f"registrar: GetInfo from kubelet", flush=True)
        return field(1, "CSIPlugin") + field(2, driver) + field(3, endpoint) + field(4, "1.0.0")

    def notify(request, _context):
        status = decode(request)
        print(f"registrar: plugin_registered={bool(status.get(1))} error={status.get(2, '')!r}", flush=True)
        return b""

    raw = {"request_deserializer": bytes, "response_serializer": bytes}
    handlers = {
        "GetInfo": grpc.unary_unary_rpc_method_handler(get_info, **raw),
        "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(notify, **raw),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("pluginregistration.Registration", handlers),))
    if os.path.exists(sock):
        os.unlink(sock)
    server.add_insecure_port("unix:" + sock)
    server.start()
    print(f"registrar: serving {sock} for {driver} at {endpoint}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    os.unlink(sock)
    server.stop(1)


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main()
