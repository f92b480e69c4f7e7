# Drover node AMI: Debian 12 (bookworm), containerd, kubelet/kubeadm/kubectl
# from pkgs.k8s.io, and the Drover agent enabled as a systemd unit. Nothing
# machine-specific is baked in: each instance gets its identity at first boot
# from the single-use ticket in its user data, which the agent reads through
# IMDSv2.
#
#   cargo build --release -p drover-agent
#   cd images/aws
#   packer init drover-node.pkr.hcl
#   packer build -var region=eu-west-1 -var kubernetes_version=v1.31.2 drover-node.pkr.hcl
#
# The agent binary must be built for the AMI's architecture and against a
# glibc no newer than bookworm's (2.36): build it on Debian 12 (or in a
# debian:bookworm container). install.sh does the work; scripts/verify-aws-image
# checks its agent phase in CI (Packer itself is not run there).

packer {
  required_plugins {
    amazon = {
      version = ">= 1.3.0"
      source  = "github.com/hashicorp/amazon"
    }
  }
}

variable "region" {
  type        = string
  default     = "us-east-1"
  description = "AWS region the AMI is built in (and registered in)."
}

variable "instance_type" {
  type        = string
  default     = "t3.medium"
  description = "Instance type of the build instance; must match architecture."
}

variable "architecture" {
  type        = string
  default     = "amd64"
  description = "Debian architecture of the AMI: amd64 or arm64. The agent binary must be built for it."
  validation {
    condition     = contains(["amd64", "arm64"], var.architecture)
    error_message = "The architecture must be amd64 or arm64."
  }
}

variable "kubernetes_version" {
  type        = string
  default     = "v1.31.2"
  description = "The exact Kubernetes release the image pins (v1.31.2); selects the pkgs.k8s.io repository core:/stable:/<minor>/deb/ and the control-plane images pulled at bake time."
  validation {
    condition     = can(regex("^v[0-9]+\\.[0-9]+\\.[0-9]+$", var.kubernetes_version))
    error_message = "The kubernetes_version must be an exact release such as v1.31.2."
  }
}

variable "agent_binary" {
  type        = string
  default     = ""
  description = "Path of the drover-agent binary to bake in (default: target/release/drover-agent of this repository)."
}

variable "ami_name_prefix" {
  type        = string
  default     = "drover-node"
  description = "AMI names are <prefix>-k8s-<version>-debian-12-<architecture>-<UTC timestamp>."
}

variable "volume_size" {
  type        = number
  default     = 20
  description = "Root volume size in GiB (container images and etcd live there)."
}

locals {
  agent_binary = var.agent_binary != "" ? var.agent_binary : "${path.root}/../../target/release/drover-agent"
  unit_file    = "${path.root}/../systemd/drover-agent.service"
  timestamp    = formatdate("YYYYMMDD-hhmmss", timestamp())
  ec2_arch     = var.architecture == "arm64" ? "arm64" : "x86_64"
  ami_name     = "${var.ami_name_prefix}-k8s-${replace(var.kubernetes_version, ".", "-")}-debian-12-${var.architecture}-${local.timestamp}"
  # Where the build instance receives the files; removed before the snapshot.
  staging = "/tmp/drover-image"
}

source "amazon-ebs" "debian" {
  region        = var.region
  instance_type = var.instance_type

  # Debian's official AMIs (account 136693071363, the Debian cloud team).
  # "debian-12-<arch>-*" matches the stable images, not the backports or
  # daily ones.
  source_ami_filter {
    owners      = ["136693071363"]
    most_recent = true
    filters = {
      name                = "debian-12-${var.architecture}-*"
      architecture        = local.ec2_arch
      root-device-type    = "ebs"
      virtualization-type = "hvm"
    }
  }
  ssh_username = "admin"

  ami_name        = local.ami_name
  ami_description = "Drover node: Debian 12, containerd, Kubernetes ${var.kubernetes_version} (kubeadm), drover-agent"
  # Instances launched from the AMI require IMDSv2 by default; the agent
  # reads its user data that way.
  imds_support = "v2.0"
  ena_support  = true

  # The build instance itself, too.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  launch_block_device_mappings {
    device_name           = "/dev/xvda"
    volume_size           = var.volume_size
    volume_type           = "gp3"
    delete_on_termination = true
  }

  run_tags = {
    Name = "packer ${local.ami_name}"
  }
  tags = {
    Name                        = local.ami_name
    "drover:kubernetes-version" = var.kubernetes_version
    "drover:base-ami"           = "{{ .SourceAMI }}"
    "drover:base-ami-name"      = "{{ .SourceAMIName }}"
  }
  snapshot_tags = {
    Name = local.ami_name
  }
}

build {
  name    = "drover-node"
  sources = ["source.amazon-ebs.debian"]

  # cloud-init of the build instance may still be running (apt, SSH keys).
  provisioner "shell" {
    inline = [
      "cloud-init status --wait >/dev/null || true",
      "rm -rf ${local.staging} && mkdir -m 0700 ${local.staging}",
    ]
  }

  provisioner "file" {
    source      = local.agent_binary
    destination = "${local.staging}/drover-agent"
  }

  # The repository's unit, exactly as shipped (images/systemd).
  provisioner "file" {
    source      = local.unit_file
    destination = "${local.staging}/drover-agent.service"
  }

  provisioner "file" {
    source      = "${path.root}/install.sh"
    destination = "${local.staging}/install.sh"
  }

  # The image's default pod network (images/cni), as staging/cni.
  provisioner "file" {
    source      = "${path.root}/../cni"
    destination = local.staging
  }

  # host, kubernetes, agent, then cleanup (cloud-init state, machine-id, SSH
  # host keys, Drover state); all in one session, as cleanup also removes
  # the build's authorized_keys.
  provisioner "shell" {
    inline = [
      "sudo bash ${local.staging}/install.sh --kubernetes-version ${var.kubernetes_version} all",
      "sudo rm -rf ${local.staging}",
    ]
  }

  post-processor "manifest" {
    output     = "packer-manifest.json"
    strip_path = true
    custom_data = {
      kubernetes_version = var.kubernetes_version
    }
  }
}
