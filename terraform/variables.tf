# --- where and what ---------------------------------------------------------------------------

variable "region" {
  description = "AWS region of the bucket and the node (also AWS_REGION for Silt's S3 client)."
  type        = string
  default     = "eu-west-1"
}

variable "name" {
  description = "Name of the deployment: prefix of every resource name, and a tag."
  type        = string
  default     = "silt"

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,20}$", var.name))
    error_message = "name: 1 to 21 characters, lowercase letters, digits and '-' (it prefixes the bucket name)."
  }
}

variable "tags" {
  description = "Extra tags for every resource."
  type        = map(string)
  default     = {}
}

# --- the node ---------------------------------------------------------------------------------

variable "instance_type" {
  description = "EC2 instance type; its architecture must match `architecture` (e.g. m7g.large for arm64)."
  type        = string
  default     = "m6i.large"
}

variable "architecture" {
  description = "CPU architecture of the AMI and of the Silt binary: amd64 or arm64."
  type        = string
  default     = "amd64"

  validation {
    condition     = contains(["amd64", "arm64"], var.architecture)
    error_message = "architecture: amd64 or arm64."
  }
}

variable "ami_id" {
  description = "AMI to boot; null: the newest official Debian 12 image for `architecture`."
  type        = string
  default     = null
}

variable "key_name" {
  description = "EC2 key pair for SSH (user `admin` on Debian); null: no key. SSH also needs `ssh_cidrs`."
  type        = string
  default     = null
}

variable "subnet_id" {
  description = "Subnet of the node (its VPC holds the security groups); null: the first default subnet of the region's default VPC."
  type        = string
  default     = null
}

variable "root_volume_size_gb" {
  description = "Size of the root volume (gp3, encrypted), which holds the data directory: the commitlog, the index and the hot cache of uploaded segments (tiering.hot_cache_bytes, 1 GiB by default)."
  type        = number
  default     = 50

  validation {
    condition     = var.root_volume_size_gb >= 8
    error_message = "root_volume_size_gb: at least 8."
  }
}

# --- the Silt binary --------------------------------------------------------------------------

variable "silt_download_url" {
  description = "HTTPS URL of the Silt binary (`cargo build --profile dist -p silt` gives target/dist/silt), downloaded once at first boot."
  type        = string

  validation {
    condition     = can(regex("^https://[^[:space:]'\"\\\\]+$", var.silt_download_url))
    error_message = "silt_download_url: an https:// URL without spaces, quotes or backslashes."
  }
}

variable "silt_sha256" {
  description = "SHA-256 of the binary at silt_download_url (`sha256sum target/dist/silt`); a download that differs is not installed."
  type        = string

  validation {
    condition     = can(regex("^[0-9a-f]{64}$", var.silt_sha256))
    error_message = "silt_sha256: 64 lowercase hex digits."
  }
}

# --- the bucket -------------------------------------------------------------------------------

variable "bucket_name" {
  description = "Name of the S3 bucket created for Silt; null: `name` followed by a unique suffix."
  type        = string
  default     = null
}

variable "object_prefix" {
  description = "Key prefix of this node's data in the bucket (tiering.object_store = s3://BUCKET/PREFIX); the instance role reaches nothing else."
  type        = string
  default     = "silt"

  validation {
    condition     = can(regex("^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$", var.object_prefix))
    error_message = "object_prefix: path segments of letters, digits, '.', '_' and '-', without a leading or trailing '/'."
  }
}

variable "abort_incomplete_multipart_days" {
  description = "Days after which the bucket aborts an incomplete multipart upload (a backstop: Silt aborts the ones it left at its next start)."
  type        = number
  default     = 7

  validation {
    condition     = var.abort_incomplete_multipart_days >= 1
    error_message = "abort_incomplete_multipart_days: at least 1."
  }
}

variable "force_destroy_bucket" {
  description = "Let `terraform destroy` delete the bucket with every message in it."
  type        = bool
  default     = false
}

# --- who may connect --------------------------------------------------------------------------

variable "mqtt_cidrs" {
  description = "CIDR blocks (IPv4 or IPv6) allowed to reach MQTT on 1883."
  type        = list(string)
  default     = []
}

variable "mqtt_tls_cidrs" {
  description = "CIDR blocks allowed to reach MQTT over TLS on 8883 (the listener exists only with mqtt_tls_cert_pem)."
  type        = list(string)
  default     = []
}

variable "kafka_cidrs" {
  description = "CIDR blocks allowed to reach the Kafka listener on 9092."
  type        = list(string)
  default     = []
}

variable "admin_cidrs" {
  description = "CIDR blocks allowed to reach the admin listener on 8080 (/metrics, /readyz, /iceberg; no authentication). Empty: it binds loopback only."
  type        = list(string)
  default     = []
}

variable "ssh_cidrs" {
  description = "CIDR blocks allowed to reach SSH on 22."
  type        = list(string)
  default     = []
}

variable "kafka_advertised_host" {
  description = "Host name Kafka clients are told to connect to (kafka.advertised); null: the Elastic IP's public DNS name."
  type        = string
  default     = null
}

variable "mqtt_tls_cert_pem" {
  description = "PEM certificate chain (leaf first) of the MQTT TLS listener; null: no TLS listener. Travels in the user data."
  type        = string
  default     = null
}

variable "mqtt_tls_key_pem" {
  description = "PEM private key of the MQTT TLS listener, with mqtt_tls_cert_pem. Travels in the user data: see README."
  type        = string
  default     = null
  sensitive   = true
}

variable "allow_anonymous" {
  description = "mqtt.auth.allow_anonymous: clients without a username are let in from \"loopback\" only (Silt's default), \"always\" or \"never\". Kafka clients follow the same rule."
  type        = string
  default     = "loopback"

  validation {
    condition     = contains(["loopback", "always", "never"], var.allow_anonymous)
    error_message = "allow_anonymous: loopback, always or never."
  }
}

variable "password_file_content" {
  description = "Content of a Silt password file (`silt passwd FILE USER`), installed as mqtt.auth.password_file; null: usernames are not checked."
  type        = string
  default     = null
  sensitive   = true
}

variable "extra_config" {
  description = "TOML appended to the generated silt.toml: tables it does not already have ([storage], [topic_defaults], [[topics]], [lakehouse], ...)."
  type        = string
  default     = ""
}
