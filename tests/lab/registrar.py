"""The registration half of node-driver-registrar, for the lab's kubelet.

    registrar.py DRIVER ENDPOINT REGISTRATION_SOCKET

node-driver-registrar cannot be built here (the Go module proxy serves no
version of github.com/kubernetes-csi/node-driver-registrar), so this plays
the part of it that kubelet talks to: it serves kubelet's plugin
registration API (package `pluginregistration`, service `Registration`,
kubelet 1.20's pkg/kubelet/apis/pluginregistration/v1/api.proto) on
REGISTRATION_SOCKET, which kubelet finds under its plugins_registry folder.
kubelet calls GetInfo, then itself calls the driver's NodeGetInfo on
ENDPOINT, writes the CSINode and the Node's annotation, and reports the
outcome with NotifyRegistrationStatus, which this prints. Removing the
socket (on SIGTERM) unregisters the driver.

The messages are encoded by hand (no generated code): PluginInfo is
{1 type, 2 name, 3 endpoint, 4 repeated supported_versions}, all strings;
RegistrationStatus is {1 bool plugin_registered, 2 string error}.
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


def main():
    driver, endpoint, sock = sys.argv[1:4]

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
