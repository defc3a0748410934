//! The served agent over a real mTLS socket (the simulated backend behind
//! it): which clients rustls admits, and the limits of `crate::limits`.
//! The kernel adds nothing here; the lab's `agent_mtls_*` test covers the
//! same server over the real backends.
use crate::{
    config::{AgentConfig, BackendConfig, Limits, TlsConfig},
    export::Exporter,
    marks::MarkStore,
    server::serve,
    service::{
        sim::{SimBackend, SimExporter},
        sim_lvm::SimLvm,
        Agent,
    },
};
use pillar_csi_lab::tls::{Ca, Pem, Projected};
use pillar_csi_proto::agent::v1::{self as pb, agent_service_client::AgentServiceClient};
use std::{
    net::SocketAddr,
    os::unix::fs::PermissionsExt,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;

type R<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A served agent, its CA and its simulated exporter.
struct Served {
    addr: SocketAddr,
    ca: Ca,
    exporter: Arc<SimExporter>,
    state: std::path::PathBuf,
    dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn free_port() -> R<SocketAddr> {
    let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(probe.local_addr()?)
}

async fn served(limits: Limits) -> R<Served> {
    served_as(limits, |ca, _| ca.server("agent", LOOPBACK.into())).await
}

const LOOPBACK: [u8; 4] = [127, 0, 0, 1];

/// A served agent whose server certificate `server` makes (from the CA, in
/// the served folder).
async fn served_as(
    limits: Limits,
    server: impl FnOnce(&Ca, &std::path::Path) -> R<Pem>,
) -> R<Served> {
    let dir = tempfile::tempdir()?;
    let ca = Ca::new(dir.path(), "agent-ca")?;
    let server = server(&ca, dir.path())?;
    let state = dir.path().join("state");
    let exporter = Arc::new(SimExporter::default());
    let agent = Agent::new(
        vec![Arc::new(SimBackend::default()), Arc::new(SimLvm::default())],
        vec![exporter.clone() as Arc<dyn Exporter>],
        MarkStore::open(&state)?,
    );
    let addr = free_port()?;
    let config = AgentConfig {
        // What the simulators serve (serve() validates; the agent is built).
        backends: vec![
            BackendConfig::Zfs {
                pool: "tank".into(),
                parent_dataset: Some("k8s".into()),
            },
            BackendConfig::Lvm {
                volume_group: crate::service::sim_lvm::VG.into(),
                thin_pool: None,
            },
        ],
        listen: addr,
        state_dir: state.clone(),
        tls: TlsConfig {
            cert: Some(server.cert),
            key: Some(server.key),
            client_ca: Some(ca.pem.cert.clone()),
        },
        limits,
        resync_interval_seconds: 0,
        ..AgentConfig::default()
    };
    let task = tokio::spawn(async move {
        if let Err(e) = serve(&config, agent, "test").await {
            eprintln!("agent stopped: {e}");
        }
    });
    let served = Served {
        addr,
        ca,
        exporter,
        state,
        dir,
        task,
    };
    // Ready once a good client is answered.
    let good = served.ca.client("controller")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(mut c) = served.client(Some(&good)).await {
            if c.health_check(pb::HealthCheckRequest {}).await.is_ok() {
                return Ok(served);
            }
        }
        if Instant::now() > deadline {
            return Err("the agent did not answer within 20 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Served {
    async fn client(&self, identity: Option<&Pem>) -> R<AgentServiceClient<Channel>> {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(std::fs::read(&self.ca.pem.cert)?))
            .domain_name("127.0.0.1");
        if let Some(id) = identity {
            tls = tls.identity(Identity::from_pem(
                std::fs::read(&id.cert)?,
                std::fs::read(&id.key)?,
            ));
        }
        let channel = Endpoint::from_shared(format!("https://{}", self.addr))?
            .tls_config(tls)?
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await?;
        Ok(AgentServiceClient::new(channel))
    }
}

fn token(uid: &str) -> Option<pb::FenceToken> {
    Some(pb::FenceToken {
        volume_uid: uid.into(),
        generation: 1,
    })
}

fn create(name: &str) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        volume_id: format!("tank/{name}"),
        backend_type: pb::BackendType::ZfsZvol as i32,
        capacity_bytes: 1 << 20,
        fence: token(name),
        ..Default::default()
    }
}

fn export(name: &str) -> pb::ExportVolumeRequest {
    pb::ExportVolumeRequest {
        volume_id: format!("tank/{name}"),
        backend_type: pb::BackendType::ZfsZvol as i32,
        protocol_type: pb::ProtocolType::NvmeofTcp as i32,
        fence: token(name),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_a_current_client_certificate_of_the_agents_ca_is_admitted() -> R {
    let s = served(Limits::default()).await?;
    let good = s.ca.client("controller")?;
    let expired = s.ca.expired_client("expired")?;
    let server_only = s.ca.server_only("not-a-client")?;
    let other = Ca::new(s.dir.path(), "other-ca")?.client("intruder")?;
    let mut c = s.client(Some(&good)).await?;
    c.create_volume(create("kept")).await?;
    for (what, identity) in [
        ("an expired client certificate", Some(&expired)),
        ("a certificate without clientAuth", Some(&server_only)),
        ("a client certificate from another CA", Some(&other)),
        ("no client certificate", None),
    ] {
        let attempt = async {
            let mut c = s.client(identity).await?;
            c.create_volume(create("intruder")).await?;
            R::Ok(())
        };
        assert!(attempt.await.is_err(), "{what}: CreateVolume answered");
    }
    let plain = async {
        let channel = Endpoint::from_shared(format!("http://{}", s.addr))?
            .connect()
            .await?;
        AgentServiceClient::new(channel)
            .create_volume(create("plain"))
            .await?;
        R::Ok(())
    };
    assert!(plain.await.is_err(), "plaintext: CreateVolume answered");
    let listed = c
        .list_volumes(pb::ListVolumesRequest::default())
        .await?
        .into_inner();
    let ids: Vec<&str> = listed
        .volumes
        .iter()
        .map(|v| v.volume_id.as_str())
        .collect();
    assert_eq!(ids, ["tank/kept"], "refused clients created nothing");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_state_folder_and_marks_are_the_owners_only() -> R {
    let s = served(Limits::default()).await?;
    let mut c = s.client(Some(&s.ca.client("controller")?)).await?;
    c.create_volume(create("private")).await?;
    let mode =
        |p: &std::path::Path| -> R<u32> { Ok(std::fs::metadata(p)?.permissions().mode() & 0o777) };
    assert_eq!(mode(&s.state)?, 0o700, "state folder");
    let marks: Vec<_> = std::fs::read_dir(&s.state)?.collect::<Result<_, _>>()?;
    assert_eq!(marks.len(), 1, "{marks:?}");
    for m in marks {
        assert_eq!(mode(&m.path())?, 0o600, "{}", m.path().display());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_oversized_request_is_resource_exhausted_and_changes_nothing() -> R {
    let s = served(Limits {
        max_message_bytes: 64 << 10,
        ..Limits::default()
    })
    .await?;
    let mut c = s.client(Some(&s.ca.client("controller")?)).await?;
    c.create_volume(create("big")).await?;
    let mut request = export("big");
    request.acl_enabled = true;
    // 2,000 host NQNs of about 60 bytes: over 100 KiB.
    request.allowed_initiators = (0..2000)
        .map(|i| format!("nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-{i:012}"))
        .collect();
    let e = c.export_volume(request).await.expect_err("over the limit");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("the limit is: 65536 bytes"),
        "{}",
        e.message()
    );
    assert!(s.exporter.exports.lock().map_err(|_| "poison")?.is_empty());
    c.export_volume(export("big")).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_over_the_in_flight_limit_are_refused_until_one_ends() -> R {
    let s = served(Limits {
        max_concurrent_requests: 2,
        ..Limits::default()
    })
    .await?;
    let good = s.ca.client("controller")?;
    let mut c = s.client(Some(&good)).await?;
    for name in ["slow-a", "slow-b"] {
        c.create_volume(create(name)).await?;
    }
    s.exporter.delay_ms.store(3000, Ordering::SeqCst);
    let slow: Vec<_> = ["slow-a", "slow-b"]
        .into_iter()
        .map(|name| {
            let mut c = c.clone();
            tokio::spawn(async move { c.export_volume(export(name)).await })
        })
        .collect();
    // Once both exports are inside the agent (each holds a slot until it
    // answers), a third call is refused at once.
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.exporter.started.load(Ordering::SeqCst) < 2 {
        if Instant::now() > deadline {
            return Err("the two exports did not start within 5 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = c
        .health_check(pb::HealthCheckRequest {})
        .await
        .expect_err("a third call while two are in flight");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("maxConcurrentRequests"),
        "{}",
        refused.message()
    );
    for answer in slow {
        answer.await??;
    }
    s.exporter.delay_ms.store(0, Ordering::SeqCst);
    c.health_check(pb::HealthCheckRequest {}).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_past_its_deadline_is_answered_and_the_export_still_lands() -> R {
    let s = served(Limits {
        request_timeout_seconds: 1,
        ..Limits::default()
    })
    .await?;
    let mut c = s.client(Some(&s.ca.client("controller")?)).await?;
    c.create_volume(create("late")).await?;
    s.exporter.delay_ms.store(5000, Ordering::SeqCst);
    let started = Instant::now();
    let e = c.export_volume(export("late")).await.expect_err("deadline");
    let waited = started.elapsed();
    assert_eq!(e.code(), Code::Cancelled, "{e:?}");
    assert!(
        waited < Duration::from_millis(2500),
        "answered after {waited:?}"
    );
    // The export ran on in its own task, holding the volume's lock; the
    // retry (as the CO makes) waits for it and finds it done.
    s.exporter.delay_ms.store(0, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s
        .exporter
        .exports
        .lock()
        .map_err(|_| "poison")?
        .contains_key("tank/late")
    {
        assert!(Instant::now() < deadline, "the export never landed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.export_volume(export("late")).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_certificate_renewed_in_place_is_served_without_a_restart() -> R {
    let started = Instant::now();
    let at = |what: &str| eprintln!("{:5.1} s  {what}", started.elapsed().as_secs_f64());
    let mut mounted = None;
    let s = served_as(Limits::default(), |ca, dir| {
        let short =
            ca.short_lived_server("agent-short", LOOPBACK.into(), Duration::from_secs(8))?;
        let projected = Projected::new(&dir.join("mtls"), &short, &ca.pem.cert)?;
        let pem = projected.pem.clone();
        mounted = Some(projected);
        Ok(pem)
    })
    .await?;
    let mut mounted = mounted.ok_or("the certificate was not mounted")?;
    at("agent serving a server certificate valid for 8 s");
    let good = s.ca.client("controller")?;
    // Each call on a new connection: a handshake with the server's
    // certificate of that moment.
    let call = || async {
        s.client(Some(&good))
            .await?
            .health_check(pb::HealthCheckRequest {})
            .await?;
        R::Ok(())
    };
    call().await?;
    at("a new connection is answered");
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        match call().await {
            Ok(()) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Ok(()) => return Err("the certificate did not expire within 20 s".into()),
            Err(e) => break format!("{e:?}"),
        }
    };
    assert!(refused.contains("Expired"), "{refused}");
    at("the certificate expired: a new connection's handshake fails");
    let renewed = s.ca.server("agent-renewed", LOOPBACK.into())?;
    mounted.swap(&renewed, &s.ca.pem.cert)?;
    at("renewed in place (..data swapped to the new files)");
    call().await?;
    at("the next new connection is answered, the agent not restarted");
    Ok(())
}
