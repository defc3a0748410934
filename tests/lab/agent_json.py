#!/usr/bin/env python3
"""An independent gRPC JSON client of the agent, standing in for grpcurl.

    agent_json.py ADDRESS PROTO_ROOT GEN_DIR [METHOD] < request.json

The spec (spec/adopt-lvm-lv.md, "Inspect an LV") calls InspectVolume with
`grpcurl -import-path proto -proto pillar_csi/agent/v1/agent.proto
-emit-defaults -plaintext -d @ ADDRESS pillar_csi.agent.v1.AgentService/...`
and reads the answer with jq. grpcurl is not installable on the lab machine,
so this does the same with no code from the repository: it compiles
PROTO_ROOT/pillar_csi/agent/v1/agent.proto with grpc_tools.protoc into
GEN_DIR (never into the repository), reads the request as proto3 JSON from
standard input (the .proto field names, as grpcurl accepts them), calls
METHOD (default InspectVolume) over plaintext HTTP/2, and prints the answer
as proto3 canonical JSON with defaults: camelCase names, enums by name,
64-bit integers as strings.

Against an mTLS agent, set AGENT_JSON_CACERT (the CA of the agent's
certificate), AGENT_JSON_CERT and AGENT_JSON_KEY (the client certificate
and key) and AGENT_JSON_SERVERNAME (the name the agent's certificate is
issued for), as grpcurl's -cacert, -cert, -key and -servername.

On an RPC error it prints grpcurl's form to standard error
("ERROR:\n  Code: <Name>\n  Message: <text>") and exits with 64 + the gRPC
status code, as grpcurl does.
"""
import importlib
import inspect
import os
import sys

import grpc
from google.protobuf import json_format

PROTO = "pillar_csi/agent/v1/agent.proto"


def compiled(proto_root, gen_dir):
    """Whether GEN_DIR already holds both modules, newer than the .proto."""
    source = os.path.getmtime(os.path.join(proto_root, PROTO))
    base = os.path.join(gen_dir, os.path.splitext(PROTO)[0])
    try:
        return all(os.path.getmtime(base + s) >= source for s in ("_pb2.py", "_pb2_grpc.py"))
    except OSError:
        return False


def compile_proto(proto_root, gen_dir):
    # Compiled once per GEN_DIR (the lab's work folder): importing grpc_tools
    # and running protoc are left to the first call.
    if not compiled(proto_root, gen_dir):
        from grpc_tools import protoc

        os.makedirs(gen_dir, exist_ok=True)
        # grpc_tools ships google/protobuf/*.proto (timestamp.proto is imported).
        well_known = os.path.join(os.path.dirname(protoc.__file__), "_proto")
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{proto_root}",
                f"-I{well_known}",
                f"--python_out={gen_dir}",
                f"--grpc_python_out={gen_dir}",
                os.path.join(proto_root, PROTO),
            ]
        )
        if rc != 0:
            sys.exit(f"protoc failed on {PROTO} (status {rc})")
    sys.path.insert(0, gen_dir)
    pb2 = importlib.import_module("pillar_csi.agent.v1.agent_pb2")
    grpc_pb2 = importlib.import_module("pillar_csi.agent.v1.agent_pb2_grpc")
    return pb2, grpc_pb2


def to_json(message):
    # -emit-defaults: protobuf < 5.26 calls it including_default_value_fields,
    # later releases always_print_fields_with_no_presence.
    params = inspect.signature(json_format.MessageToJson).parameters
    if "including_default_value_fields" in params:
        return json_format.MessageToJson(message, including_default_value_fields=True)
    return json_format.MessageToJson(message, always_print_fields_with_no_presence=True)


def channel_to(address):
    cacert = os.environ.get("AGENT_JSON_CACERT")
    if not cacert:
        return grpc.insecure_channel(address)

    def read(name):
        path = os.environ.get(name)
        if not path:
            return None
        with open(path, "rb") as f:
            return f.read()

    credentials = grpc.ssl_channel_credentials(
        root_certificates=read("AGENT_JSON_CACERT"),
        private_key=read("AGENT_JSON_KEY"),
        certificate_chain=read("AGENT_JSON_CERT"),
    )
    options = []
    if os.environ.get("AGENT_JSON_SERVERNAME"):
        options.append(("grpc.ssl_target_name_override", os.environ["AGENT_JSON_SERVERNAME"]))
    return grpc.secure_channel(address, credentials, options=options)


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    address, proto_root, gen_dir = sys.argv[1:4]
    method = sys.argv[4] if len(sys.argv) == 5 else "InspectVolume"
    pb2, grpc_pb2 = compile_proto(proto_root, gen_dir)
    service = pb2.DESCRIPTOR.services_by_name["AgentService"]
    rpc = service.methods_by_name[method]
    request_class = getattr(pb2, rpc.input_type.name)
    request = json_format.Parse(sys.stdin.read() or "{}", request_class())
    with channel_to(address) as channel:
        stub = grpc_pb2.AgentServiceStub(channel)
        try:
            response = getattr(stub, method)(request, timeout=300)
        except grpc.RpcError as e:
            code = e.code()
            name = "".join(w.capitalize() for w in code.name.split("_"))
            print(f"ERROR:\n  Code: {name}\n  Message: {e.details()}", file=sys.stderr)
            sys.exit(64 + code.value[0])
    print(to_json(response))


if __name__ == "__main__":
    main()
