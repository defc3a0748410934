// The spec's signing program (spec/adopt-lvm-lv.md, "Sign the grant and
// latch it"), verbatim except one line: `now := time.Now()` reads
// signingTime(), which is time.Now() unless PILLAR_SIGN_NOW (RFC 3339)
// fixes it, so crosslang.rs can compare its bytes with `pillar-csi
// recovery sign --now` for the same inputs. crosslang.rs generates the
// gen/go package of this revision's agent.proto beside it and builds it.
package main

import (
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"time"

	agentv1 "github.com/isac322/pillar-csi/gen/go/pillar_csi/agent/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

var det = proto.MarshalOptions{Deterministic: true}

func digest(m proto.Message) []byte {
	b, err := det.Marshal(m)
	if err != nil {
		panic(err)
	}
	d := sha256.Sum256(b)
	return d[:]
}

// usage: sign inspect.json operator-key.pem <new PVS uid> <new generation>
func main() {
	raw, _ := os.ReadFile(os.Args[1])
	var resp agentv1.InspectVolumeResponse
	if err := protojson.Unmarshal(raw, &resp); err != nil {
		panic(err)
	}
	snap := resp.GetSnapshot()
	unsigned := proto.Clone(snap).(*agentv1.RecoverySnapshot)
	unsigned.Signature = nil

	keyPEM, _ := os.ReadFile(os.Args[2])
	block, _ := pem.Decode(keyPEM)
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		panic(err)
	}
	var newGen uint64
	fmt.Sscan(os.Args[4], &newGen)
	now := signingTime()
	auth := &agentv1.RecoveryAuthorization{
		SnapshotDigest:   digest(unsigned),
		VolumeId:         snap.GetVolumeId(),
		BackendType:      snap.GetBackendType(),
		LvmSource:        snap.GetLvmSource(),
		OldVolumeUid:     snap.GetOldVolumeUid(),
		OldGeneration:    snap.GetOldGeneration(),
		NewVolumeUid:     os.Args[3],
		NewGeneration:    newGen,
		PreserveOriginal: proto.Bool(snap.GetPreserveOriginal()),
		IssuedAt:         timestamppb.New(now.Add(-time.Minute)),
		ExpiresAt:        timestamppb.New(now.Add(time.Hour)),
	}
	d := digest(auth)
	sig, err := key.(crypto.Signer).Sign(rand.Reader, d, crypto.SHA256)
	if err != nil {
		panic(err)
	}
	auth.Signature = sig
	snapBytes, _ := det.Marshal(snap)
	authBytes, _ := det.Marshal(auth)
	fmt.Println("snapshot:", base64.StdEncoding.EncodeToString(snapBytes))
	fmt.Println("authorization:", base64.StdEncoding.EncodeToString(authBytes))
	fmt.Println("authorizationDigest:", hex.EncodeToString(d))
}

// signingTime is time.Now(), or PILLAR_SIGN_NOW when it is set.
func signingTime() time.Time {
	if s := os.Getenv("PILLAR_SIGN_NOW"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			panic(err)
		}
		return t
	}
	return time.Now()
}
