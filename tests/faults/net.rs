//! A network of the test's own: network namespaces, each a host with one address, joined by
//! veth pairs to a bridge that lives in a namespace of its own (the switch). One more veth pair
//! joins this machine's namespace to the switch, with the network's last address, so the test
//! reaches every host. A host can be cut off (its port on the switch taken down: packets to and
//! from it are lost, as in a partition, and nothing is refused) and healed. Everything is
//! removed on drop. Needs root and iproute2; the addresses are in 10.213.0.0/16 and only ever
//! inside this network.
//!
//! The bridge is not in this machine's namespace on purpose: where br_netfilter is loaded (Docker
//! loads it), bridged packets go through the namespace's iptables, and Docker's FORWARD policy
//! drops them. A fresh namespace has no rules.

use std::net::Ipv4Addr;
use std::process::Command;

use hookrelay_tools::node::Host;

pub struct Net {
    switch: String,
    /// This machine's end of the link to the switch.
    uplink: String,
    /// Per host: its namespace, its port on the switch, its address.
    hosts: Vec<(String, String, Ipv4Addr)>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip (iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A /24 of 10.213.0.0/16 that no interface of this machine has yet.
fn free_subnet() -> u8 {
    let taken = Command::new("ip")
        .args(["-4", "-o", "addr"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let start = uuid::Uuid::new_v4().as_bytes()[0];
    (0..=255u8)
        .map(|i| start.wrapping_add(i))
        .find(|n| *n != 0 && !taken.contains(&format!("10.213.{n}.")))
        .expect("a free /24 in 10.213.0.0/16")
}

impl Net {
    /// `n` hosts, up and reachable from this process.
    pub fn new(n: usize) -> Net {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..6];
        let subnet = free_subnet();
        let mut net = Net {
            switch: format!("hr-{id}-sw"),
            uplink: format!("hru{id}"),
            hosts: Vec::new(),
        };
        let sw = net.switch.clone();
        let made = (|| -> Result<(), String> {
            ip(&["netns", "add", &sw])?;
            ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
            ip(&["-n", &sw, "link", "set", "br0", "up"])?;
            // A port of the switch: `outer` goes into the switch, `inner` stays where it is.
            let plug = |outer: &str, inner: &str| -> Result<(), String> {
                ip(&["link", "add", outer, "type", "veth", "peer", "name", inner])?;
                ip(&["link", "set", outer, "netns", &sw])?;
                ip(&["-n", &sw, "link", "set", outer, "master", "br0"])?;
                ip(&["-n", &sw, "link", "set", outer, "up"])
            };
            plug(&format!("hrs{id}"), &net.uplink)?;
            let gateway = format!("10.213.{subnet}.254/24");
            ip(&["addr", "add", &gateway, "dev", &net.uplink])?;
            ip(&["link", "set", &net.uplink, "up"])?;
            for i in 0..n {
                let ns = format!("hr-{id}-{i}");
                let outer = format!("hrp{id}{i}");
                let inner = format!("hrh{id}{i}");
                let addr = Ipv4Addr::new(10, 213, subnet, 1 + i as u8);
                ip(&["netns", "add", &ns])?;
                net.hosts.push((ns.clone(), outer.clone(), addr));
                plug(&outer, &inner)?;
                ip(&["link", "set", &inner, "netns", &ns])?;
                ip(&[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{addr}/24"),
                    "dev",
                    &inner,
                ])?;
                ip(&["-n", &ns, "link", "set", &inner, "up"])?;
                ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            }
            Ok(())
        })();
        if let Err(e) = made {
            panic!("cannot make the test network (root and iproute2 are needed): {e}");
        }
        net
    }

    /// The hosts, for [`hookrelay_tools::node::Node::start_on`].
    pub fn hosts(&self) -> Vec<Host> {
        self.hosts
            .iter()
            .map(|(ns, _, addr)| Host {
                netns: ns.clone(),
                addr: *addr,
            })
            .collect()
    }

    /// Cuts host `i` off from the others and from this machine.
    pub fn cut(&self, i: usize) {
        ip(&["-n", &self.switch, "link", "set", &self.hosts[i].1, "down"]).unwrap();
    }

    /// Joins host `i` again.
    pub fn heal(&self, i: usize) {
        ip(&["-n", &self.switch, "link", "set", &self.hosts[i].1, "up"]).unwrap();
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth ends in it, and with them their peers.
        for (ns, _, _) in &self.hosts {
            let _ = ip(&["netns", "del", ns]);
        }
        let _ = ip(&["netns", "del", &self.switch]);
        let _ = ip(&["link", "del", &self.uplink]);
    }
}
