// csc, the CSI command-line client of rexray/gocsi, as `make deps` builds it
// for src/tests/unix_authority.rs: `go build github.com/rexray/gocsi/csc` in
// this folder, with every module pinned by go.sum. (`go install
// github.com/rexray/gocsi/csc@v1.2.2` would also ask the module proxy for the
// module's version list, which it refuses.) gocsi v1.2.2 is built with
// grpc-go v1.19, which sends the endpoint (unix:///path) as :authority.
module pillar-csi/csc

go 1.23

require github.com/rexray/gocsi v1.2.2

require (
	github.com/container-storage-interface/spec v1.2.0 // indirect
	github.com/golang/protobuf v1.3.1 // indirect
	github.com/inconshreveable/mousetrap v1.0.0 // indirect
	github.com/konsorten/go-windows-terminal-sequences v1.0.1 // indirect
	github.com/sirupsen/logrus v1.2.0 // indirect
	github.com/spf13/cobra v0.0.1 // indirect
	github.com/spf13/pflag v1.0.0 // indirect
	golang.org/x/crypto v0.0.0-20180904163835-0709b304e793 // indirect
	golang.org/x/net v0.0.0-20181220203305-927f97764cc3 // indirect
	golang.org/x/sys v0.0.0-20181116152217-5ac8a444bdc5 // indirect
	golang.org/x/text v0.3.0 // indirect
	google.golang.org/genproto v0.0.0-20180817151627-c66870c02cf8 // indirect
	google.golang.org/grpc v1.19.0 // indirect
)
