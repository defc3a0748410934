# The chart's objects that the guides' commands read or change, as
# `helm install pillar-csi charts/pillar-csi -n pillar-csi` makes them: the
# CSIDriver and the controller's Deployment (whose replica count the world
# follows; no pod of it is scheduled, the world runs the processes).
set -euo pipefail
kubectl apply -f - <<'YAML'
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata:
  name: pillar-csi.bhyoo.com
spec:
  attachRequired: true
  podInfoOnMount: false
  fsGroupPolicy: File
  volumeLifecycleModes: [Persistent]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: pillar-csi-controller
  namespace: pillar-csi
  labels:
    app.kubernetes.io/instance: pillar-csi
    app.kubernetes.io/component: controller
spec:
  replicas: 1
  selector:
    matchLabels:
      app.kubernetes.io/instance: pillar-csi
      app.kubernetes.io/component: controller
  template:
    metadata:
      labels:
        app.kubernetes.io/instance: pillar-csi
        app.kubernetes.io/component: controller
    spec:
      serviceAccountName: pillar-csi-controller
      containers:
        - name: controller
          image: pillar-csi:lab
          args: [controller]
YAML
