"""kubectl against the lab API server that conftest.py's `server` fixture starts."""
import json
import pathlib
import subprocess


def kubectl(server: pathlib.Path, *args, user=None, stdin=None, check=True) -> str:
    """kubectl as the admin, or as `user` (a ServiceAccount of scripts/apiserver.sh).
    With check, a failure fails the test and stdout is returned; without, the
    output of both streams."""
    config = server / ("kubeconfig" if user is None else f"kubeconfig-{user}")
    result = subprocess.run(["kubectl", "--kubeconfig", str(config), *args],
                            input=stdin, capture_output=True, text=True)
    if check:
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result.stdout
    return result.stdout + result.stderr


def can(server: pathlib.Path, user: str, verb: str, resource: str,
        namespace: str = "pillar-csi") -> bool:
    """The server's answer to `user` asking "may I?" (a SelfSubjectAccessReview;
    `resource` is `plural[.group][/subresource]`, no discovery needed)."""
    qualified, _, subresource = resource.partition("/")
    plural, _, group = qualified.partition(".")
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": {
                  "verb": verb, "group": group, "resource": plural,
                  "subresource": subresource, "namespace": namespace}}}
    answer = kubectl(server, "create", "-f", "-", "-o", "json", user=user,
                     stdin=json.dumps(review))
    return json.loads(answer)["status"]["allowed"]
