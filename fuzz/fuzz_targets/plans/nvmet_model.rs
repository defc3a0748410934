//! An in-memory nvmet configfs: applies the steps of a plan to a
//! [`nvmet::State`] as the kernel would, refusing what the kernel refuses
//! (a folder made twice or removed while not empty or still linked, a
//! namespace's device changed while it is enabled, a port's address written
//! while a subsystem is linked to it, a link to a missing object, any host
//! allowed next to `attr_allow_any_host`). No such model existed (the
//! crate's unit tests check step lists, and the lab runs the real kernel),
//! so the fuzz crate has this one; it is test scaffolding, not the code
//! under test.
use nvmet::{Namespace, Nqn, Nsid, Port, PortId, State, Step, Subsystem, Transport};
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
};

/// The state plus the port address attributes as written (the kernel keeps
/// them as separate files; the state holds the address they make).
#[derive(Debug, Clone, Default)]
pub struct Model {
    pub state: State,
    addrs: BTreeMap<PortId, (Option<IpAddr>, Option<u16>)>,
}

fn nqn(s: &str) -> Result<Nqn, String> {
    Nqn::new(s).map_err(|e| e.to_string())
}

fn nsid(s: &str) -> Result<Nsid, String> {
    s.parse().map_err(|e: nvmet::InvalidName| e.to_string())
}

fn port_id(s: &str) -> Result<PortId, String> {
    s.parse().map_err(|e: nvmet::InvalidName| e.to_string())
}

impl Model {
    /// Runs `steps` in order; the first refusal stops them.
    pub fn run(&mut self, steps: &[Step]) -> Result<(), String> {
        for step in steps {
            self.step(step).map_err(|e| format!("{step:?}: {e}"))?;
        }
        Ok(())
    }

    fn sub(&mut self, name: &str) -> Result<&mut Subsystem, String> {
        let n = nqn(name)?;
        self.state
            .subsystems
            .get_mut(&n)
            .ok_or_else(|| format!("no subsystem {n}"))
    }

    fn port(&mut self, id: &str) -> Result<&mut Port, String> {
        let id = port_id(id)?;
        self.state
            .ports
            .get_mut(&id)
            .ok_or_else(|| format!("no port {id}"))
    }

    fn linked(&self, n: &Nqn) -> bool {
        self.state.ports.values().any(|p| p.subsystems.contains(n))
    }

    fn step(&mut self, step: &Step) -> Result<(), String> {
        match step {
            Step::Mkdir(path) => self.mkdir(path),
            Step::Rmdir(path) => self.rmdir(path),
            Step::Write { path, value } => self.write(path, value),
            Step::Symlink { target, link } => self.symlink(target, link),
            Step::Unlink(path) => self.unlink(path),
        }
    }

    fn mkdir(&mut self, path: &str) -> Result<(), String> {
        let p: Vec<&str> = path.split('/').collect();
        let fresh = match p.as_slice() {
            ["hosts", h] => self.state.hosts.insert(nqn(h)?),
            ["subsystems", s] => {
                let n = nqn(s)?;
                if self.state.subsystems.contains_key(&n) {
                    false
                } else {
                    self.state.subsystems.insert(n, Subsystem::default());
                    true
                }
            }
            ["subsystems", s, "namespaces", id] => {
                let id = nsid(id)?;
                let sub = self.sub(s)?;
                if sub.namespaces.contains_key(&id) {
                    false
                } else {
                    sub.namespaces.insert(id, Namespace::default());
                    true
                }
            }
            ["ports", id] => {
                let id = port_id(id)?;
                if self.state.ports.contains_key(&id) {
                    false
                } else {
                    self.state.ports.insert(
                        id,
                        Port {
                            transport: Transport::Other(String::new()),
                            address: None,
                            inline_data_size: None,
                            max_queue_size: None,
                            subsystems: Default::default(),
                        },
                    );
                    self.addrs.insert(id, (None, None));
                    true
                }
            }
            _ => return Err("not a folder the kernel makes".into()),
        };
        fresh.then_some(()).ok_or_else(|| "exists".into())
    }

    fn rmdir(&mut self, path: &str) -> Result<(), String> {
        let p: Vec<&str> = path.split('/').collect();
        match p.as_slice() {
            ["hosts", h] => {
                let h = nqn(h)?;
                if self
                    .state
                    .subsystems
                    .values()
                    .any(|s| s.allowed_hosts.contains(&h))
                {
                    return Err("a subsystem links the host".into());
                }
                self.state.hosts.remove(&h).then_some(()).ok_or("absent")?;
            }
            ["subsystems", s] => {
                let n = nqn(s)?;
                if self.linked(&n) {
                    return Err("a port links the subsystem".into());
                }
                let sub = self.state.subsystems.get(&n).ok_or("absent")?;
                if !sub.namespaces.is_empty() || !sub.allowed_hosts.is_empty() {
                    return Err("not empty".into());
                }
                self.state.subsystems.remove(&n);
            }
            ["subsystems", s, "namespaces", id] => {
                let id = nsid(id)?;
                self.sub(s)?.namespaces.remove(&id).ok_or("absent")?;
            }
            ["ports", id] => {
                let id = port_id(id)?;
                let port = self.state.ports.get(&id).ok_or("absent")?;
                if !port.subsystems.is_empty() {
                    return Err("not empty".into());
                }
                self.state.ports.remove(&id);
                self.addrs.remove(&id);
            }
            _ => return Err("not a folder the kernel removes".into()),
        }
        Ok(())
    }

    fn write(&mut self, path: &str, value: &str) -> Result<(), String> {
        let p: Vec<&str> = path.split('/').collect();
        let flag = || match value {
            "0" => Ok(false),
            "1" => Ok(true),
            _ => Err(format!("{value:?} is not 0 or 1")),
        };
        match p.as_slice() {
            ["subsystems", s, "attr_serial"] => self.sub(s)?.serial = Some(value.into()),
            ["subsystems", s, "attr_model"] => self.sub(s)?.model = Some(value.into()),
            ["subsystems", s, "attr_allow_any_host"] => {
                let on = flag()?;
                let sub = self.sub(s)?;
                if on && !sub.allowed_hosts.is_empty() {
                    return Err("allowed hosts are linked".into());
                }
                sub.allow_any_host = on;
            }
            ["subsystems", s, "namespaces", id, attr] => {
                let id = nsid(id)?;
                let ns = self.sub(s)?.namespaces.get_mut(&id).ok_or("no namespace")?;
                if *attr == "enable" {
                    let on = flag()?;
                    if on && ns.device_path.as_os_str().is_empty() {
                        return Err("no device to enable".into());
                    }
                    ns.enabled = on;
                    return Ok(());
                }
                if ns.enabled {
                    return Err("busy: the namespace is enabled".into());
                }
                match *attr {
                    "device_path" => ns.device_path = value.into(),
                    "device_uuid" => ns.uuid = Some(value.into()),
                    "device_nguid" => ns.nguid = Some(value.into()),
                    _ => return Err("no such attribute".into()),
                }
            }
            ["ports", id, attr] => {
                let port_id = port_id(id)?;
                let port = self.port(id)?;
                if attr.starts_with("addr_") && !port.subsystems.is_empty() {
                    return Err("busy: the port is enabled".into());
                }
                let bad = |e: &dyn std::fmt::Display| format!("{value:?}: {e}");
                match *attr {
                    "addr_trtype" => port.transport = Transport::Other(value.into()),
                    "addr_adrfam" if matches!(value, "ipv4" | "ipv6") => {}
                    "param_inline_data_size" => {
                        port.inline_data_size = Some(value.parse().map_err(|e| bad(&e))?)
                    }
                    "param_max_queue_size" => {
                        port.max_queue_size = Some(value.parse().map_err(|e| bad(&e))?)
                    }
                    "addr_traddr" => {
                        let ip: IpAddr = value.parse().map_err(|e| bad(&e))?;
                        self.addrs.entry(port_id).or_default().0 = Some(ip);
                    }
                    "addr_trsvcid" => {
                        let n: u16 = value.parse().map_err(|e| bad(&e))?;
                        self.addrs.entry(port_id).or_default().1 = Some(n);
                    }
                    _ => return Err("no such attribute".into()),
                }
                let (ip, svc) = self.addrs.get(&port_id).copied().unwrap_or_default();
                let port = self.port(id)?;
                if let Transport::Other(t) = &port.transport {
                    port.transport = match t.as_str() {
                        "tcp" => Transport::Tcp,
                        "rdma" => Transport::Rdma,
                        "loop" => Transport::Loop,
                        _ => port.transport.clone(),
                    };
                }
                port.address = ip.zip(svc).map(|(ip, svc)| SocketAddr::new(ip, svc));
            }
            _ => return Err("no such attribute".into()),
        }
        Ok(())
    }

    fn symlink(&mut self, target: &str, link: &str) -> Result<(), String> {
        let t: Vec<&str> = target.split('/').collect();
        let l: Vec<&str> = link.split('/').collect();
        match (t.as_slice(), l.as_slice()) {
            (["hosts", h], ["subsystems", s, "allowed_hosts", name]) if h == name => {
                let h = nqn(h)?;
                if !self.state.hosts.contains(&h) {
                    return Err("no such host".into());
                }
                let sub = self.sub(s)?;
                if sub.allow_any_host {
                    return Err("the subsystem allows any host".into());
                }
                sub.allowed_hosts
                    .insert(h)
                    .then_some(())
                    .ok_or("exists".into())
            }
            (["subsystems", s], ["ports", id, "subsystems", name]) if s == name => {
                let n = nqn(s)?;
                if !self.state.subsystems.contains_key(&n) {
                    return Err("no such subsystem".into());
                }
                let port = self.port(id)?;
                if port.address.is_none() && port.transport != Transport::Loop {
                    return Err("the port has no address".into());
                }
                port.subsystems
                    .insert(n)
                    .then_some(())
                    .ok_or("exists".into())
            }
            _ => Err("not a link the kernel takes".into()),
        }
    }

    fn unlink(&mut self, link: &str) -> Result<(), String> {
        let l: Vec<&str> = link.split('/').collect();
        let gone = match l.as_slice() {
            ["subsystems", s, "allowed_hosts", h] => {
                let h = nqn(h)?;
                self.sub(s)?.allowed_hosts.remove(&h)
            }
            ["ports", id, "subsystems", s] => {
                let n = nqn(s)?;
                self.port(id)?.subsystems.remove(&n)
            }
            _ => return Err("not a link".into()),
        };
        gone.then_some(()).ok_or_else(|| "absent".into())
    }
}
