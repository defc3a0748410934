module github.com/isac322/pillar-csi

go 1.23.0

require google.golang.org/protobuf v1.33.0
