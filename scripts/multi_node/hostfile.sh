# shellcheck shell=bash
# The hostfile rules of scripts/multi_node/launch.sh and the 124M recipe, in one place:
#
#   read -r NODES SLOTS < <(hostfile_nodes FILE) || exit 1
#
# FILE: one node per line, "NAME slots=N" (a '#' starts a comment, blank lines are passed
# over). Every node has the same slots (one rank per GPU, placed node by node: mixed counts
# would misplace ranks), N from 1 to 1024, each name once, and names of letters, digits,
# '.', '-' and '_' only (a byte-order mark or a stray character is no host name). Prints
# "NODES SLOTS", or one error on stderr and returns 1.
hostfile_nodes() {
    local file=$1 line name rest slots="" n=0 k=0 names=" "
    [ -r "$file" ] || { echo "error: cannot read the hostfile '$file'" >&2; return 1; }
    while IFS= read -r line || [ -n "$line" ]; do
        k=$((k + 1))
        line=${line%%#*}                                   # a comment, slots= in it included
        [[ $line =~ ^[[:space:]]*$ ]] && continue
        if ! [[ $line =~ ^[[:space:]]*([A-Za-z0-9._-]+)[[:space:]]+slots=([0-9]+)[[:space:]]*$ ]]; then
            echo "error: $file line $k: '$line' is not 'NAME slots=N' (a host name of letters, digits, '.', '-', '_')" >&2
            return 1
        fi
        name=${BASH_REMATCH[1]} rest=${BASH_REMATCH[2]}
        if [ ${#rest} -gt 4 ] || [ "$((10#$rest))" -lt 1 ] || [ "$((10#$rest))" -gt 1024 ]; then
            echo "error: $file line $k: slots=$rest: give 1 to 1024 (one rank per GPU)" >&2
            return 1
        fi
        rest=$((10#$rest))
        [[ $names == *" $name "* ]] && { echo "error: $file line $k: node '$name' is listed twice" >&2; return 1; }
        if [ -n "$slots" ] && [ "$rest" != "$slots" ]; then
            echo "error: $file line $k: '$name' has slots=$rest, the nodes before it $slots: every node runs the same ranks" >&2
            return 1
        fi
        names+="$name " slots=$rest n=$((n + 1))
    done <"$file"
    [ $n -ge 1 ] || { echo "error: no node in $file" >&2; return 1; }
    echo "$n $slots"
}
