# shellcheck shell=bash
# Values the installer writes into other languages. Sourced by packaging/install-host.sh.

# A TOML basic string holding $1: quoted, \ and " escaped. It holds no control character: the
# installer's options refuse them (need_value).
toml_string() {
    local bs="\\" q='"' s="$1"
    s="${s//"$bs"/"$bs$bs"}"
    printf '"%s"' "${s//"$q"/"$bs$q"}"
}

# toml KEY VALUE: one line of a TOML table.
toml() { echo "$1 = $(toml_string "$2")"; }

# A file: URL of the absolute path $1, every byte but [A-Za-z0-9/._~-] percent-encoded: pip splits
# the value of PIP_FIND_LINKS at whitespace, so a wheelhouse path with a space goes to it as a URL.
file_url() {
    local LC_ALL=C path="$1" url="file://" c i
    for ((i = 0; i < ${#path}; i++)); do
        c="${path:i:1}"
        case "$c" in
            [A-Za-z0-9/._~-]) url+="$c" ;;
            *) printf -v c '%%%02X' "'$c"; url+="$c" ;;
        esac
    done
    printf '%s' "$url"
}
